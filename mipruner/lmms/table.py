"""`python -m mipruner.lmms.table DIR [DIR ...]`: one paper-style table from lmms-eval result files.

Reads every `*_results.json` under the folders (one per run of a sweep) and prints one line per
method x budget (x other settings) x task: accuracy, F1 and predicted yes-rate (POPE tasks and groups) or accuracy
(other tasks; lmms-eval's main metric of each task is shown as `acc`). Method and budget come from
the run's `--model_args`; runs of other models show their model name.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys

from mipruner.measure.text_table import table

METRICS = ("acc", "f1", "yes_rate")


def _model_args(text: str) -> dict:
    return dict(kv.split("=", 1) for kv in text.split(",") if "=" in kv)


def rows_of(results: dict) -> list[list[str]]:
    cfg = results.get("config", {})
    args = _model_args(cfg.get("model_args", "") or "")
    method = args.get("method", "none") if cfg.get("model") == "mipruner" else str(cfg.get("model"))
    budget = args.get("budget", "all")
    settings = " ".join(f"{k}={v}" for k, v in args.items()
                        if k not in ("pretrained", "method", "budget", "cache_dir", "device", "dtype")) or "-"
    subtasks = {t for subs in results.get("group_subtasks", {}).values() for t in subs}
    out = []
    for task, res in sorted(results.get("results", {}).items(), key=lambda kv: (kv[0] in subtasks, kv[0])):
        vals = {m: res.get(f"{m},none") for m in METRICS}
        if vals["acc"] is None:  # a task of lmms-eval with its own metric names: its first number
            first = next(((k, v) for k, v in res.items() if isinstance(v, (int, float)) and "stderr" not in k), None)
            if first is None:
                continue
            vals["acc"] = first[1]
        fmt = ["-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}" for v in vals.values()]
        out.append([method, budget, settings, task] + fmt)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mipruner.lmms.table", description=__doc__)
    p.add_argument("folders", nargs="+", help="--output_path folders of lmms-eval runs")
    a = p.parse_args(argv)
    files = sorted(f for d in a.folders for f in glob.glob(os.path.join(d, "**", "*_results.json"), recursive=True))
    if not files:
        print(f"no *_results.json under {', '.join(a.folders)}", file=sys.stderr)
        return 1
    rows = []
    for path in files:
        with open(path) as f:
            rows += rows_of(json.load(f))
    print(table(rows, ["method", "budget", "settings", "task", "acc", "f1", "yes_rate"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
