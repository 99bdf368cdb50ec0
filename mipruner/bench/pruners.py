"""`python -m mipruner.bench pruners`: every pre-LLM pruner's median time against a floor.

For each N_V (default 576, 2048, 16384), d = 4096, N_T = 32, K in {64, 10%}: the floor is one
`V @ T.T` plus `topk` on the same tensors; each pruner is reported as median ms and its ratio to
the floor, all in one run. "mi lam=0.5" is from cold (no cache: the self-PMI normaliser and the
N_V x N_V Gram matrix are built inside the call, as CDPruner and DivPrune build theirs);
"mi lam=0.5 (cached)" reuses the per-encoding cache (cross PMI and the self-PMI row normaliser
depend only on V, T and tau), as the app does when a slider moves.

The cells of one (N_V, K) are timed round-robin (one call of each method per round, `--repeats`
rounds after one warm-up round), so a load change on a shared machine hits every method alike and
the ratios within one table compare; `--clock cpu` (with `--threads 1`) times this process's CPU
time instead, which other processes on a shared machine barely move. On CUDA every call ends with `torch.cuda.synchronize()`, so
a cell is the selection's whole time, not its launch. In-LLM methods (FastV, DART) need a model:
`python -m mipruner.bench efficiency` times them.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import mipruner
from mipruner.pruners import get_pruner, resolve_budget

from .timing import table

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def variants(methods: list[str]) -> list[tuple[str, str, dict]]:
    """(label, pruner name, extra kwargs): MI at both lambdas plus a cached run."""
    out = []
    for m in methods:
        if m == "mi":
            out += [("mi lam=1", "mi", {"lam": 1.0}), ("mi lam=0.5", "mi", {"lam": 0.5}),
                    ("mi lam=0.5 (cached)", "mi", {"lam": 0.5, "cache": "warm"})]
        else:
            out.append((m, m, {}))
    return out


HEADS, D_VISION = 16, 1024  # the synthetic per-head attention's heads and features' width (CLIP-L's)


def make_inputs(n: int, d: int, n_t: int, seed: int, need_attention: bool, device="cpu", dtype=torch.float32,
                heads: bool = False, features: bool = False) -> dict:
    """Random inputs of the shapes an encoding gives (docs/plugins.md): visual, text, and when asked the
    attention / keys ([CLS] first), per-head attention and pre-projector features; `frame_index`, the tokens
    as `video_frames(n)` equal frames, for the video methods (EVS)."""
    g = torch.Generator().manual_seed(seed)
    kw = {"visual": torch.randn(n, d, generator=g), "text": torch.randn(n_t, d, generator=g)}
    if need_attention or heads:
        per_head = torch.randn(HEADS, n + 1, n + 1, generator=g).softmax(dim=-1)  # (H, N+1, N+1), [CLS] first
        kw.update(attention=per_head.mean(0), keys=torch.randn(n + 1, 64, generator=g))
        if heads:
            kw["attention_heads"] = per_head
    if features:
        kw["features"] = torch.randn(n, D_VISION, generator=g)
    kw = {k: v.to(device=device, dtype=dtype) for k, v in kw.items()}
    frames = video_frames(n)  # the video methods (EVS) read the tokens as frames; the others ignore it
    kw["frame_index"] = torch.arange(n, device=device) * frames // n
    return kw


def video_frames(n: int) -> int:
    """Frames of the synthetic video of n tokens: the largest of 8, 6, 4, 3, 2 that divides n (equal frames), else 1."""
    return next((f for f in (8, 6, 4, 3, 2) if n % f == 0), 1)


def _calls(data: dict, k: int, methods: list[str]) -> list[tuple[str, object]]:
    """(label, zero-argument call) for the floor and every variant, on the same tensors."""
    V, T = data["visual"], data["text"]
    out = [("floor (V @ T.T + topk)", lambda: (V @ T.T).amax(dim=1).topk(k))]
    for label, name, extra in variants(methods):
        spec = get_pruner(name)
        kw = {key: val for key, val in data.items() if key in ("visual", "text", *spec.inputs)}  # what it takes
        if extra.get("cache") == "warm":
            cache: dict = {}
            mipruner.prune(name, budget=k, **kw, lam=extra["lam"], cache=cache)  # fill it
            extra = {"lam": extra["lam"], "cache": cache}
        out.append((label, lambda name=name, kw=kw, extra=extra: mipruner.prune(name, budget=k, **kw, **extra)))
    return out


def time_round_robin(calls: list[tuple[str, object]], repeats: int, sync=lambda: None,
                     clock=time.perf_counter) -> dict[str, float]:
    """Median ms of each call, timed one call of each per round (after one warm-up round)."""
    times: dict[str, list[float]] = {label: [] for label, _ in calls}
    for r in range(repeats + 1):
        for label, fn in calls:
            sync()
            t0 = clock()
            fn()
            sync()
            if r:
                times[label].append(clock() - t0)
    return {label: statistics.median(t) * 1e3 for label, t in times.items()}


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def run(sizes, dim, n_text, budgets, methods, repeats, seed=0, device="cpu", dtype=torch.float32,
        clock="wall", log=print) -> list[dict]:
    device = torch.device(device)
    if clock == "cpu" and device.type != "cpu":
        raise ValueError("--clock cpu times host CPU time: use it with --device cpu only")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    results = []
    for n in sizes:
        asked = mipruner.signals_for(methods)  # what the methods read, as an encoding would give it
        data = make_inputs(n, dim, n_text, seed, asked.attention, device, dtype, heads=bool(asked.heads),
                           features=asked.features)
        for b in budgets:
            k = resolve_budget(b, n)
            ms = time_round_robin(_calls(data, k, methods), repeats, sync, CLOCKS[clock])
            floor = ms.pop("floor (V @ T.T + topk)")
            rows = [["floor (V @ T.T + topk)", f"{floor:.2f}", "1.00"]]
            results.append(dict(n_v=n, k=k, method="floor", ms=floor, ratio=1.0))
            for label, t in ms.items():
                rows.append([label, f"{t:.2f}", f"{t / floor:.2f}"])
                results.append(dict(n_v=n, k=k, method=label, ms=t, ratio=t / floor))
            log(f"\nN_V={n}  d={dim}  N_T={n_text}  K={k}  {device} {str(dtype).replace('torch.', '')}  "
                f"(torch threads: {torch.get_num_threads()}, {repeats} round-robin rounds, {clock} clock)")
            log(table(rows, ["method", "median ms", "x floor"]))
            if "mi lam=0.5" in ms and "cdpruner" in ms:
                log(f"mi lam=0.5 (cold) / cdpruner = {ms['mi lam=0.5'] / ms['cdpruner']:.2f}")
    return results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m mipruner.bench pruners", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="576,2048,16384", help="comma-separated N_V values")
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--text", type=int, default=32, help="N_T, prompt tokens")
    p.add_argument("--budgets", default="64,0.1", help="ints are tokens, floats in (0,1] are shares")
    p.add_argument("--methods", default=",".join(mipruner.list_pruners("projector") + mipruner.list_pruners("vision")),
                   help="pre-LLM methods (default: all of them)")
    p.add_argument("--repeats", type=int, default=9, help="round-robin rounds (after one warm-up round)")
    p.add_argument("--quick", action="store_true", help="N_V=576 only, 3 rounds")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="dtype of the inputs (pruners compute in fp32)")
    p.add_argument("--clock", default="wall", choices=sorted(CLOCKS),
                   help="wall: elapsed time; cpu: this process's CPU time (with --threads 1 on a shared machine, "
                        "the code's own cost without the time other processes take the core)")
    p.add_argument("--json", help="also write the rows as JSON to this file")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    sizes = [576] if a.quick else [int(s) for s in a.sizes.split(",")]
    budgets = [float(b) if "." in b else int(b) for b in a.budgets.split(",")]
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    for m in methods:
        if get_pruner(m).stage == "llm":  # also fails fast on typos, with "did you mean"
            p.error(f"{m!r} selects inside the LLM: time it with `python -m mipruner.bench efficiency`")
    rows = run(sizes, a.dim, a.text, budgets, methods, 3 if a.quick else a.repeats, device=a.device,
               dtype=DTYPES[a.dtype], clock=a.clock)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
