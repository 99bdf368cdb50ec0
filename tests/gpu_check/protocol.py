"""The paper's efficiency protocol inside `gpu-check`, sized to end within a time budget.

On the LLaVA-1.5 model of the check (7B shape, N_V = 576; tiny with --tiny), with the building blocks
of `bench gpu` (same runs, same columns), every answer `new_tokens` long (2, as for POPE; EOS masked):
cells in priority order, each `warmup` untimed runs then `repeats` timed runs (mean, std, median):
  select   each registered method at 64 tokens on one cached encoding (cold cache per call): the
           median selection time at N_V = 576 (in-LLM methods: layers 0..K-1 + ranking);
  eager    batch 1: plain `model.generate` (processor + generate, the baseline), our unpruned
           answer (`none`), MI lambda 1 at 64 tokens (encode -> select -> answer); then items/s at
           batch 1, 8, 32 for the same three; then six answers of one view (the unpruned one + 5
           methods at 64 tokens through `mipruner.answer_batch`, as the app's panel) vs one answer,
           and a slider move (the five pruned answers: the app's answer cache holds the unpruned one);
  compiled the same latency and batch 8 / 32 cells on the GPU decoding path (`--static-cache
           --compile` of `bench gpu`: lengths bucketed to 64, static KV cache, compiled decoding
           step; the warm-up runs absorb the compilation of each new shape). CUDA only.
`groups` (gpu-check's --cells) picks the groups that run: select, latency (eager batch 1), batch
(eager items/s), view (six answers vs one), compiled (its latency and batch cells); the others are
not run and not listed. The eager cells run under `torch.inference_mode()`; the compiled phase under
`torch.no_grad()` (recent torch releases have had compile bugs under inference mode), with
torch.compile's caches reset before and after it.
A cell starts only when the budget left covers its estimate (one timed run of the phase's last cell
scaled by batch size, times warmup + repeats; + 60 s of compiling for each new batch size of the
compiled phase); the others are listed under "skipped" with the reason, as are cells that raised
(the others go on). Goals (the issue's ratios) are computed from the cells.
"""
from __future__ import annotations

import statistics
import time
import traceback

import torch

import mipruner
from mipruner.serve.batch import use_decode_path
from mipruner.bench.efficiency import PROMPT, PeakMemory, make_run, measure_cell
from mipruner.bench.gpu import VIEW_CELLS, make_batch_run, make_plain_run, view_goals, view_runs
from mipruner.bench.prefill import test_image
from mipruner.pruners import get_pruner, list_pruners

MI = ("mi", {"lam": 1.0})
CELLS = ("select", "latency", "batch", "view", "compiled")  # the cell groups, in the order they run
GROUP = {"latency": "latency", "throughput": "batch", "view": "view"}  # an eager cell's kind -> its group


def _select_cells(adapter, image, budget: int, repeats: int, sync) -> list[dict]:
    enc = mipruner.encode_for(adapter, image, PROMPT, list_pruners())  # with every signal a method reads
    out = []
    for m in (m for m in list_pruners() if not get_pruner(m).video):  # an image: the video methods do not apply
        mipruner.select(adapter, enc, m, budget, cache={}, strict=False)  # warm-up
        times = []
        for _ in range(max(3, repeats)):
            sync()
            t0 = time.perf_counter()
            mipruner.select(adapter, enc, m, budget, cache={}, strict=False)
            sync()
            times.append(time.perf_counter() - t0)
        out.append({"cell": "select", "method": m, "stage": get_pruner(m).stage, "budget": budget,
                    "n_visual": enc.n_visual, "median_ms": statistics.median(times) * 1e3, "runs": len(times)})
    return out


def run_protocol(adapter, *, budget_s: float, repeats: int = 5, warmup: int = 2, new_tokens: int = 2,
                 budget: int | None = None, batches=(1, 8, 32), compiled: bool | None = None, log=print,
                 progress=None, groups=CELLS) -> dict:
    """The protocol's cells on `adapter` (a LLaVA-family adapter), within `budget_s` seconds.
    budget: kept tokens of the pruned cells (default 64, or N_V // 4 when that is smaller).
    progress: called with the report so far after every cell (the caller saves it: a run stopped at
    a time limit keeps the cells it finished). groups: the cell groups to run, of CELLS (--cells)."""
    asked = [c for c in CELLS if c in groups]
    if len(asked) != len(set(groups)):
        raise ValueError(f"unknown protocol cells {sorted(set(groups) - set(CELLS))}; choose from {', '.join(CELLS)}")
    device = adapter.device
    compiled = device.type == "cuda" if compiled is None else compiled
    image = test_image(int(adapter.config.vision_config.image_size))
    if budget is None:  # 64 tokens (the paper's smallest LLaVA-1.5 budget); a quarter of a tiny model's N_V
        budget = min(64, max(1, adapter.encode(image, PROMPT).n_visual // 4))
    mem = PeakMemory(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)  # noqa: E731
    start = time.monotonic()
    cells: list[dict] = []
    skipped: list[dict] = []
    report = {"repeats": repeats, "warmup": warmup, "new_tokens": new_tokens, "budget_tokens": budget,
              "budget_s": budget_s, "cells_asked": asked, "spent_s": 0.0, "memory": mem.kind, "cells": cells,
              "skipped": skipped}
    last: dict = {}
    name, params = MI
    label = f"{name}:lam=1"

    def plan(phase):
        if phase == "eager":
            yield "latency", "generate", "all", 1, lambda: make_plain_run(adapter, image, new_tokens)
        yield "latency", "none", "all", 1, lambda: make_run(adapter, image, "none", "all", new_tokens, {})
        yield "latency", label, budget, 1, lambda: make_run(adapter, image, name, budget, new_tokens, params)
        for b in batches:
            if phase == "compiled" and b == 1:
                continue
            if phase == "eager":
                yield "throughput", "generate", "all", b, lambda b=b: make_plain_run(adapter, image, new_tokens, b)
            yield "throughput", "none", "all", b, lambda b=b: make_batch_run(adapter, image, "none", "all",
                                                                             new_tokens, {}, b)
            yield "throughput", label, budget, b, lambda b=b: make_batch_run(adapter, image, name, budget, new_tokens,
                                                                             params, b)

    compiled_batches: set = set()

    def cell(phase, kind, method, bud, batch, make):
        if ("compiled" if phase == "compiled" else GROUP[kind]) not in asked:
            return
        # estimate: one timed run of the phase's last cell scaled by batch size, times the runs, plus
        # 60 s of compiling for a batch size the compiled phase has not run yet
        prev_batch, prev_run_s = last.get(phase, (1, 0.0))
        guess = prev_run_s * batch / prev_batch * (warmup + repeats)
        if phase == "compiled" and batch not in compiled_batches:
            guess += 60.0
        left = budget_s - (time.monotonic() - start)
        if left <= 0 or guess > left:
            skipped.append({"phase": phase, "kind": kind, "method": method, "budget": bud, "batch": batch,
                            "why": f"{left:.0f} s of the budget left, about {guess:.0f} s needed"})
            return
        t0 = time.monotonic()
        try:
            r = measure_cell(make(), repeats, warmup, mem, sync)
        except Exception as e:  # noqa: BLE001  (recorded; the other cells go on)
            skipped.append({"phase": phase, "kind": kind, "method": method, "budget": bud, "batch": batch,
                            "why": "failed: " + traceback.format_exception_only(type(e), e)[-1].strip()})
            if device.type == "cuda":
                torch.cuda.empty_cache()
            return
        if r["new_tokens"] != new_tokens:
            r["warning"] = f"decoded {r['new_tokens']} tokens, not {new_tokens}"
        last[phase] = (batch, r["total_ms"] / 1e3)
        if phase == "compiled":
            compiled_batches.add(batch)
        r.update(phase=phase, kind=kind, method=method, budget=bud, batch=batch, wall_s=time.monotonic() - t0)
        cells.append(r)
        report["spent_s"] = round(time.monotonic() - start, 1)
        if progress is not None:
            progress(report)
        log(f"  protocol {phase:>8} {kind:>10} {method:>10} {str(bud):>4} x{batch:<3} {r['median_ms']:.1f} ms "
            f"(mean {r['total_ms']:.1f} +- {r['std_ms']:.1f}), peak {r['peak_mb']:.0f} MB")

    with torch.inference_mode():
        if "select" in asked:
            cells += _select_cells(adapter, image, budget, repeats, sync)
            log("  protocol select (median ms at " + f"{budget} of {cells[0]['n_visual']} tokens): " +
                ", ".join(f"{c['method']} {c['median_ms']:.2f}" for c in cells))
        for c in plan("eager"):
            cell("eager", *c)
        one, six, moved, n = view_runs(adapter, image, budget, new_tokens)
        cell("eager", "view", VIEW_CELLS[0], "all", 1, lambda: one)
        cell("eager", "view", VIEW_CELLS[1].format(n=n), budget, n, lambda: six)
        cell("eager", "view", VIEW_CELLS[2].format(m=n - 1), budget, n - 1, lambda: moved)
    if "compiled" in asked and not compiled:
        skipped.append({"phase": "compiled", "why": "compiled cells run on CUDA only (or compiled=True)"})
    elif "compiled" in asked:
        with torch.no_grad():
            try:
                torch.compiler.reset()
                use_decode_path(adapter, bucket=64, static_cache=True, compile=True)
                for c in plan("compiled"):
                    cell("compiled", *c)
            except Exception as e:  # noqa: BLE001  (recorded; the check's rows stand)
                skipped.append({"phase": "compiled", "why": f"failed: {type(e).__name__}: {e}"})
            finally:
                use_decode_path(adapter)
                torch.compiler.reset()
    report["spent_s"] = round(time.monotonic() - start, 1)
    report["goals"] = goals(cells, label)
    return report


def _find(cells, **kw):
    for c in cells:
        if all(c.get(k) == v for k, v in kw.items()):
            return c
    return None


def goals(cells: list[dict], label: str) -> dict:
    """The issue's figures as ratios of cells of this run (None where a cell is missing)."""
    sel = [c for c in cells if c.get("cell") == "select"]
    pre = [c for c in sel if c["stage"] != "llm"]
    out: dict = {"select_median_ms": {c["method"]: round(c["median_ms"], 3) for c in sel},
                 "select_under_1ms": (all(c["median_ms"] < 1.0 for c in pre) if pre else None),
                 "select_over_1ms": [c["method"] for c in pre if c["median_ms"] >= 1.0]}
    for phase in ("eager", "compiled"):
        gen = _find(cells, phase="eager", kind="latency", method="generate")
        mi = _find(cells, phase=phase, kind="latency", method=label)
        out[f"mi_vs_generate_{phase}"] = (round(mi["median_ms"] / gen["median_ms"], 3) if gen and mi else None)
        for b in (8, 32):
            none, m = (_find(cells, phase=phase, kind="throughput", method=x, batch=b) for x in ("none", label))
            llm = lambda c: c["total_ms"] - c["encode_ms"] - c["select_ms"]  # noqa: E731
            out[f"batch{b}_mi_items_vs_none_{phase}"] = (round(none["total_ms"] / m["total_ms"], 3)
                                                        if none and m else None)
            out[f"batch{b}_mi_llm_items_vs_none_{phase}"] = (round(llm(none) / llm(m), 3) if none and m else None)
    view = [c for c in cells if c.get("kind") == "view"]
    one = _find(view, budget="all")
    six = next((c for c in view if c.get("budget") != "all" and not c["method"].endswith("(slider)")), None)
    moved = next((c for c in view if c["method"].endswith("(slider)")), None)
    out.update(view_goals(*(c["median_ms"] if c else None for c in (one, six, moved))))
    out["targets"] = {"select_under_1ms": True, "mi_vs_generate": "<= 0.5", "batch32_mi_items_vs_none": ">= 4",
                      "six_answers_vs_one": "<= 1.5"}
    return out
