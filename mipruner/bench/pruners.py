"""`python -m mipruner.bench pruners`: every pruner's median time against a floor.

For each N_V (default 576, 2048, 16384), d = 4096, N_T = 32, K in {64, 10%}: the floor is one
`V @ T.T` plus `topk` on the same tensors; each pruner is reported as median ms and its ratio to
the floor, all in one run. "mi lam=0.5 (cached)" reuses the per-encoding cache (cross PMI and the
self-PMI row normaliser depend only on V, T and tau), as the app does when a slider moves.
"""
from __future__ import annotations

import argparse
import json

import torch

import mipruner
from mipruner.pruners import get_pruner, resolve_budget

from .timing import measure, median_ms, table


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


def make_inputs(n: int, d: int, n_t: int, seed: int, need_attention: bool) -> dict:
    g = torch.Generator().manual_seed(seed)
    kw = {"visual": torch.randn(n, d, generator=g), "text": torch.randn(n_t, d, generator=g)}
    if need_attention:
        att = torch.randn(n + 1, n + 1, generator=g).softmax(dim=-1)  # (N+1, N+1), [CLS] first
        kw.update(attention=att, keys=torch.randn(n + 1, 64, generator=g))
    return kw


def run(sizes, dim, n_text, budgets, methods, repeats, seed=0, log=print) -> list[dict]:
    results = []
    for n in sizes:
        needs_att = any(get_pruner(m).needs_attention for m in methods)
        data = make_inputs(n, dim, n_text, seed, needs_att)
        V, T = data["visual"], data["text"]
        for b in budgets:
            k = resolve_budget(b, n)
            floor = median_ms(measure(lambda: (V @ T.T).amax(dim=1).topk(k), repeats))
            rows = [["floor (V @ T.T + topk)", f"{floor:.2f}", "1.00"]]
            results.append(dict(n_v=n, k=k, method="floor", ms=floor, ratio=1.0))
            for label, name, extra in variants(methods):
                spec = get_pruner(name)
                kw = {key: val for key, val in data.items()
                      if key in ("visual", "text") or key in spec.params}
                if extra.get("cache") == "warm":
                    cache: dict = {}
                    mipruner.prune(name, budget=k, **kw, lam=extra["lam"], cache=cache)  # fill it
                    extra = {"lam": extra["lam"], "cache": cache}
                ms = median_ms(measure(lambda: mipruner.prune(name, budget=k, **kw, **extra), repeats))
                rows.append([label, f"{ms:.2f}", f"{ms / floor:.2f}"])
                results.append(dict(n_v=n, k=k, method=label, ms=ms, ratio=ms / floor))
            log(f"\nN_V={n}  d={dim}  N_T={n_text}  K={k}  (torch threads: {torch.get_num_threads()})")
            log(table(rows, ["method", "median ms", "x floor"]))
    return results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m mipruner.bench pruners", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="576,2048,16384", help="comma-separated N_V values")
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--text", type=int, default=32, help="N_T, prompt tokens")
    p.add_argument("--budgets", default="64,0.1", help="ints are tokens, floats in (0,1] are shares")
    p.add_argument("--methods", default=",".join(mipruner.list_pruners()))
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--quick", action="store_true", help="N_V=576 only, 3 repeats")
    p.add_argument("--json", help="also write the rows as JSON to this file")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    sizes = [576] if a.quick else [int(s) for s in a.sizes.split(",")]
    budgets = [float(b) if "." in b else int(b) for b in a.budgets.split(",")]
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    for m in methods:
        get_pruner(m)  # fail fast with "did you mean"
    rows = run(sizes, a.dim, a.text, budgets, methods, 3 if a.quick else a.repeats)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
