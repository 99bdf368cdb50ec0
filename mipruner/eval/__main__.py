"""`python -m mipruner.eval`: accuracy (and POPE F1 / yes-rate, query recall) per method x budget.

Examples:
  python -m mipruner.eval --model shapes-llava --task shapes-pope --n 60 --methods mi,random --budgets 8,16,32
  python -m mipruner.eval --model llava-hf/llava-1.5-7b-hf --task pope \
      --data coco_pope_random.json,coco_pope_popular.json,coco_pope_adversarial.json --images val2014/ \
      --methods mi,random,similarity --budgets 64,32 --json pope.json
  python -m mipruner.eval --model shapes-llava --task shapes-pope --n 60 --methods mi,fastv,dart --budgets 8,16 --layer 2
Sweeps (one parameter over a question set, CSV + JSON + PNG curves): python -m mipruner.eval sweep --help
Methods from outside the package: --plugins my_module,./my_file.py (or env MIPRUNER_PLUGINS; installed
plug-ins load by themselves), e.g. --plugins my_pruners --methods center,mi
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import mipruner
from mipruner.plugins import load_for_cli, take_plugins_arg
from mipruner.pruners import check_budget

from .cli_options import add_param_options, param_values
from .runner import evaluate, format_rows
from .tasks import read_pope

TASKS = ("shapes-pope", "shapes-open", "shapes-video", "shapes-events", "pope")


def parse_budgets(text: str) -> list:
    """--budgets "8,16,0.25" -> [8, 16, 0.25], each checked (`check_budget`) before any model loads."""
    out = []
    for b in text.split(","):
        b = b.strip()
        out.append(check_budget(float(b) if "." in b else int(b)))
    return out


def build_items(a):
    if a.task == "pope":
        if not a.data or not a.images:
            raise SystemExit("--task pope needs --data FILE[,FILE...] and --images DIR")
        return read_pope(a.data.split(","), a.images, n=a.n)
    from .shapes import shapes_items

    return shapes_items(a.task, n=a.n, seed=a.seed)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    argv, plugins = take_plugins_arg(argv)  # before the parameter options: a plug-in's Params get theirs
    load_for_cli(plugins)
    if argv[:1] == ["sweep"]:
        from .sweep.cli import main as sweep_main

        return sweep_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m mipruner.eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="shapes-llava", help="hub id, local directory or alias")
    p.add_argument("--task", choices=TASKS, default="shapes-pope")
    p.add_argument("--data", help="POPE question file(s), comma-separated (task pope)")
    p.add_argument("--images", help="folder of the POPE images (task pope)")
    p.add_argument("--n", type=int, default=60, help="items: exactly N (shapes-open, shapes-video, shapes-events), the first N per file (pope), at least N per "
                        "split (shapes-pope: whole scenes; --n 3 gives 4 at the default seed)")
    p.add_argument("--seed", type=int, default=1234, help="scene seed (held out from training)")
    p.add_argument("--methods", default="mi,random,similarity")
    p.add_argument("--plugins", help="modules or .py files registering more methods, comma-separated (env MIPRUNER_PLUGINS)")
    p.add_argument("--budgets", default="8,16,32", help="ints are tokens, floats in (0,1] shares")
    p.add_argument("--equal-compute", type=float, default=None, metavar="SHARE",
                   help="compare at equal compute: per method, of --budgets the one whose prefill FLOPs are "
                        "closest to SHARE (in (0, 1]) of the unpruned model's; the table says which budget")
    add_param_options(p)
    p.add_argument("--text-mode", choices=("question", "nostop", "prompt"), default="question")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--device", default=None)
    p.add_argument("--json", help="write the rows to this JSON file")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-batch", action="store_true",
                   help="answer each (method, budget) alone instead of one batch per item (the same greedy "
                        "tokens except at float near-ties; what a one-item-at-a-time evaluator such as lmms-eval does)")
    a = p.parse_args(argv)
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    for m in methods:
        if m != "none":
            mipruner.get_pruner(m)  # unknown names fail before any model is loaded
    params = param_values(a)
    budgets = parse_budgets(a.budgets)
    if a.equal_compute is not None and not 0.0 < a.equal_compute <= 1.0:
        raise SystemExit(f"--equal-compute must be a share in (0, 1], got {a.equal_compute}")
    items = build_items(a)
    adapter = mipruner.load(a.model, device=a.device)
    progress = None
    if not a.no_progress:
        from tqdm import tqdm as progress
    rows = evaluate(adapter, items, ["none"] + [m for m in methods if m != "none"], budgets,
                    params, a.task, text_mode=a.text_mode, max_new_tokens=a.max_new_tokens,
                    progress=progress, batch=not a.no_batch, equal_compute=a.equal_compute)
    print(format_rows(rows))
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    broken = {(r["method"], r["error"]) for r in rows if r.get("failed")}
    for method, why in sorted(broken, key=str):
        n = max(r["failed"] for r in rows if r["method"] == method)
        print(f"{why} ({n} run{'s' if n != 1 else ''} failed; the other methods' rows are complete)", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
