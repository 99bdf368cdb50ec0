"""`python -m mipruner.eval sweep`: one parameter over a question set; writes CSV, JSON and PNG curves.

Examples (the embedded model; --set pope|pope-random|pope-popular|pope-adversarial|open|clips):
  python -m mipruner.eval sweep --set pope --n 100 --methods mi,random,similarity \\
      --param budget --values 4,8,16,32,64 --out sweeps/budget
  python -m mipruner.eval sweep --set open --n 60 --methods mi --param lam --values 0,0.25,0.5,0.75,1 --budget 16
  python -m mipruner.eval sweep --set pope --methods mi,similarity --param text_mode --values question,nostop,prompt
  python -m mipruner.eval sweep --set pope --methods mi,mi_adaptive --k-rule gain \\
      --param budget --values 4,8,16,32,64 --x kept
  python -m mipruner.eval sweep --zip my_set.zip --methods mi,random --param budget --values 32,64,128 \\
      --model llava-hf/llava-1.5-7b-hf
A zip holds images/videos and questions.jsonl ({"media", "question", "answer"} per line; see the
docs/sweeps.md). Ctrl-C stops after the current selection and still writes what finished.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import mipruner

from ..cli_options import add_param_options, param_values
from .run import Sweep, SweepResult, generated_set, run_sweep, sweepable
from .plot import PLOTTED, X_AXES
from .sets import GENERATED, unpacked_set


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mipruner.eval sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="shapes-llava", help="hub id, local directory or alias")
    p.add_argument("--set", choices=GENERATED, default="pope", help="a generated question set (embedded model)")
    p.add_argument("--zip", help="your own set: a zip of images/videos with questions.jsonl (instead of --set)")
    p.add_argument("--questions", help="the JSONL of questions when it is not inside the zip")
    p.add_argument("--n", type=int, default=60, help="items (generated sets: in all; a zip: the first n)")
    p.add_argument("--seed", type=int, default=1234, help="scene seed of a generated set (1234: held out)")
    p.add_argument("--methods", default="mi,random,similarity")
    p.add_argument("--param", default="budget", help=f"what to sweep: {', '.join(sweepable())}")
    p.add_argument("--values", default="4,8,16,32,64", help="comma-separated values of --param")
    p.add_argument("--budget", default="16", help="the budget when another parameter is swept (int tokens or share)")
    add_param_options(p)
    p.add_argument("--text-mode", default="question", help="prompt tokens scored (when not swept)")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--seeds", default="0,1,2", help="seeds of Random (averaged), unless --param seed")
    p.add_argument("--x", choices=X_AXES, default="value", help="x axis: the swept value, or mean tokens kept")
    p.add_argument("--equal-compute", type=float, default=None, metavar="SHARE",
                   help="also print, per method, the swept budget whose prefill FLOPs are closest to SHARE (in "
                        "(0, 1]) of the unpruned model's (--param budget)")
    p.add_argument("--metrics", help=f"curves to draw, comma-separated (default: every one with data): "
                   f"{', '.join(PLOTTED)}")
    p.add_argument("--out", help="output prefix: writes PREFIX.csv, .json, .png (default: outputs/sweep-<param>)")
    p.add_argument("--from-json", help="re-plot a sweep's JSON (no model run): writes PREFIX.png and prints the table; "
                   "several, comma-separated, are overlaid (with --x kept)")
    p.add_argument("--device", default=None)
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    metrics = [m.strip() for m in a.metrics.split(",")] if a.metrics else None
    bad = sorted(set(metrics or ()) - set(PLOTTED))
    if bad:
        raise SystemExit(f"sweep: unknown --metrics {bad}; choose from {', '.join(PLOTTED)}")
    if a.from_json:
        res, *others = [SweepResult.from_json(f) for f in a.from_json.split(",")]
        prefix = a.out or a.from_json.split(",")[0].rsplit(".", 1)[0]
        try:
            res.plot(prefix + ".png", x=a.x, others=others, metrics=metrics)
        except ValueError as e:
            raise SystemExit(f"sweep: {e}") from None
        for r in (res, *others):
            print(r.table())
            if a.equal_compute is not None:
                print(r.table_at_compute(a.equal_compute))
        print(f"wrote {prefix}.png")
        return 0
    if a.equal_compute is not None and (not 0.0 < a.equal_compute <= 1.0 or a.param != "budget"):
        raise SystemExit(f"sweep: --equal-compute takes a share in (0, 1] and --param budget, "
                         f"got {a.equal_compute} with --param {a.param}")
    with contextlib.ExitStack() as unpacked:  # a zip's media: unpacked for the run, removed afterwards
        return _run(a, metrics, unpacked)


def _run(a, metrics, unpacked: contextlib.ExitStack) -> int:
    methods = tuple(m.strip() for m in a.methods.split(",") if m.strip())
    try:
        sweep = Sweep(methods=methods, param=a.param.replace("-", "_"), values=a.values, budget=a.budget,
                      params=param_values(a), text_mode=a.text_mode, max_new_tokens=a.max_new_tokens, seeds=a.seeds)
        if a.zip:
            items = unpacked.enter_context(unpacked_set(a.zip, a.questions, n=a.n))
            set_name = os.path.basename(a.zip)
        else:
            items, set_name = generated_set(a.set, n=a.n, seed=a.seed), f"{a.set} (seed {a.seed})"
    except (ValueError, OSError) as e:
        raise SystemExit(f"sweep: {e}") from None
    t0 = time.perf_counter()
    adapter = mipruner.load(a.model, device=a.device)
    load_s = time.perf_counter() - t0
    bar = None
    if not a.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(items), desc=f"sweep {sweep.param}", unit="item")
    progress = (lambda done, total: bar.update(done - bar.n)) if bar else None
    res = run_sweep(adapter, items, sweep, progress=progress, set_name=set_name, model=a.model)
    if bar:
        bar.close()
    if res.n_items == 0:
        print("sweep: interrupted before the first item finished; nothing written", file=sys.stderr)
        return 130
    prefix = a.out or os.path.join("outputs", f"sweep-{sweep.param}")
    if os.path.dirname(prefix):
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
    res.to_csv(prefix + ".csv")
    res.to_json(prefix + ".json")
    res.plot(prefix + ".png", x=a.x, metrics=metrics)
    print(res.table())
    if a.equal_compute is not None:
        print(res.table_at_compute(a.equal_compute))
    print(f"{res.n_items} items ({res.n_encodes} encodings), {len(res.records)} answers ({res.n_llm_calls} LLM calls, "
          f"the rest reused) in {res.wall_s:.1f} s (model load {load_s:.1f} s); wrote {prefix}.csv, .json, .png")
    if res.cancelled:
        print(f"sweep: interrupted after {res.n_items} of {len(items)} items; the files hold those", file=sys.stderr)
        return 130
    for method, why, n in res.failures:
        print(f"{why} ({n} run{'s' if n != 1 else ''} failed; the other methods' rows are complete)", file=sys.stderr)
    return 1 if res.failures else 0


__all__ = ["build_parser", "main"]
