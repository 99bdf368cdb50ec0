"""`python -m mipruner.bench gpu-check`: every family x media x registered method on one device, one report.

For each family of `mipruner.bench.zoo` (random weights at the real 7B / 2B-3B shapes; `--tiny`: a
few small layers, for CPU smoke runs) and each medium it takes (image; several images; a video of
8 frames), ONE encoding, then the keep-all anchor and every registered method (pre-LLM and in-LLM)
at two budgets given as shares of that encoding's N_V (`--shares`, default 0.25 and 0.1: K =
max(1, floor(share * N_V + 0.5)), so budgets scale with the shape): select, answer one by one, answer
batched as the app does (rows and columns: `mipruner/bench/gpu_check_rows.py`). A failing row is
recorded with its error and the run goes on; models are freed between families.

`--protocol` (default: on on CUDA, off on the CPU) then times the paper's protocol of `bench gpu` on
the LLaVA-1.5 model of the check, within `--budget-s` seconds (default 200): 5 timed runs after 2
warm-ups per cell, cells in priority order, a cell started only when its estimate fits the budget
left (`mipruner/bench/gpu_check_protocol.py`). Fit on an H100 (one 10-minute command): seven
models built on the GPU (seconds each), about 400 rows of a few 7B forward passes each (4 new
tokens), then the protocol's 200 s; the report is rewritten after every family, so a run stopped
at the limit still leaves every finished row in `--json`.

`--llm-layers N` keeps every real shape but gives the LLMs N decoder layers: the CPU proxy of a
full-size run (the real towers, processors, token counts, widths and vocabularies; 7B LLMs at full
depth do not fit in a small CPU machine's memory in fp32).

Report (`--json`): {"device": torch's device name, "torch", "transformers", "dtype", "tiny", "llm_layers", "command",
"families": [one per (family, media): N_V, encode ms, description], "rows": [...], "protocol": ...}.
Exit code 0 when every row is ok, else 1 (the failing rows are printed).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import torch

from mipruner.pruners import get_pruner, list_pruners

from .gpu_check_rows import Clock, check_media, format_rows, last_line, planned_rows
from .zoo import FAMILIES, PROMPTS, get_family, make_media

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device.type)


def _names(text: str | None, known: list[str], what: str) -> list[str]:
    if not text or text.strip() == "all":
        return list(known)
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in known:
            raise SystemExit(f"unknown {what} {n!r}; choose from {', '.join(known)}")
    return names


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m mipruner.bench gpu-check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny random models (CPU smoke runs; timings mean nothing)")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--llm-layers", type=int, default=None, metavar="N",
                   help="the LLMs' depth instead of the configs' (e.g. 2: the real towers, processors, widths and "
                        "vocabularies on a CPU, where 7B models at full depth do not fit or take hours)")
    p.add_argument("--dtype", default=None, choices=tuple(DTYPES), help="default: bf16 on cuda, fp32 elsewhere")
    p.add_argument("--families", default="all", help=f"'all' or some of {','.join(FAMILIES)}")
    p.add_argument("--media", default="all", help="'all' or some of image,images,video (where a family takes it)")
    p.add_argument("--methods", default="all", help="'all' (every registered method, plug-ins loaded with "
                   "--plugins included) or names")
    p.add_argument("--shares", default="0.25,0.1", help="budgets as shares of each encoding's N_V: 25%% and 10%% "
                   "by default, K = max(1, floor(share * N_V + 0.5)), so they scale with the shape")
    p.add_argument("--new-tokens", type=int, default=4, help="greedy answer length of the rows (at most)")
    p.add_argument("--static-cache", action="store_true", help="answer the rows on the GPU decoding path "
                   "(lengths bucketed to 64, static KV cache), not the plain path the app uses")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the report here (rewritten after every family)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--protocol", dest="protocol", action="store_true", default=None,
                   help="time the paper's protocol too (default on CUDA)")
    g.add_argument("--no-protocol", dest="protocol", action="store_false")
    p.add_argument("--budget-s", type=float, default=200.0,
                   help="seconds the protocol may take (cells that would not fit: skipped, listed in the report)")
    p.add_argument("--repeats", type=int, default=5, help="protocol: timed runs per cell")
    p.add_argument("--warmup", type=int, default=2, help="protocol: untimed runs per cell")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    return p.parse_args(argv)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def run(a, log=print) -> dict:
    import transformers

    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype_name = a.dtype or ("bf16" if device.type == "cuda" else "fp32")
    protocol = (device.type == "cuda") if a.protocol is None else a.protocol
    families = _names(a.families, list(FAMILIES), "family")
    methods = _names(a.methods, list_pruners(), "method")
    media = _names(a.media, ["image", "images", "video"], "medium")
    if a.llm_layers is not None and a.llm_layers < 1:
        raise SystemExit(f"--llm-layers must be at least 1, got {a.llm_layers}")
    shares = [float(s) for s in a.shares.split(",") if s.strip()]
    if not shares or any(not 0 < s <= 1 for s in shares):
        raise SystemExit(f"--shares must be shares in (0, 1], got {a.shares!r}")
    report = {"device": device_name(device), "torch": torch.__version__, "transformers": transformers.__version__,
              "dtype": dtype_name, "tiny": bool(a.tiny), "llm_layers": a.llm_layers,
              "command": "python -m mipruner.bench gpu-check " +
              " ".join(sys.argv[1:] if a.command is None else a.command), "shares": shares,
              "new_tokens": a.new_tokens, "static_cache": bool(a.static_cache), "methods": methods,
              "families": [], "rows": [], "protocol": None}
    clock = Clock(device)
    t_start = time.monotonic()

    def save():
        report["wall_s"] = round(time.monotonic() - t_start, 1)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(report, f, indent=1)

    for name in families:
        fam = get_family(name)
        kinds = [k for k in fam.media if k in media]
        t0 = time.monotonic()
        try:
            adapter, desc = fam.build(tiny=a.tiny, device=device, dtype=DTYPES[dtype_name], seed=a.seed,
                                      llm_layers=a.llm_layers)
            if a.static_cache:
                from mipruner.batch import use_decode_path

                use_decode_path(adapter, bucket=64, static_cache=True)
        except Exception as e:  # noqa: BLE001  (every row of the family fails with the reason)
            err = f"building the model failed: {last_line(e)}"
            log(f"{name}: {err}")
            for k in kinds:
                report["rows"] += planned_rows(name, k, methods, shares, err)
                report["families"].append({"family": name, "media": k, "error": err})
            save()
            continue
        log(f"{name}: {desc} (built in {time.monotonic() - t0:.1f} s)")
        for k in kinds:
            medium = make_media(k, a.tiny, fam.video_frames)
            rows, info = check_media(adapter, name, k, medium, PROMPTS[k], methods, shares, a.new_tokens, clock,
                                     log=log)
            report["rows"] += rows
            report["families"].append(dict(info, description=desc))
            save()
        if protocol and name == "llava":
            report["protocol"] = _protocol(adapter, a, log, lambda p: (report.update(protocol=p), save()))
            save()
        del adapter
        _free(device)
    if protocol and "llava" not in families:
        adapter, _ = get_family("llava").build(tiny=a.tiny, device=device, dtype=DTYPES[dtype_name], seed=a.seed,
                                              llm_layers=a.llm_layers)
        report["protocol"] = _protocol(adapter, a, log, lambda p: (report.update(protocol=p), save()))
        del adapter
        _free(device)
    save()
    return report


def _protocol(adapter, a, log, progress) -> dict:
    from .gpu_check_protocol import run_protocol

    try:
        return run_protocol(adapter, budget_s=a.budget_s, repeats=a.repeats, warmup=a.warmup, log=log,
                            progress=progress)
    except Exception as e:  # noqa: BLE001  (the rows stand; the report says why the protocol is missing)
        log(f"protocol failed: {last_line(e)}")
        return {"error": last_line(e)}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv)
    a.command = argv
    if a.threads:
        torch.set_num_threads(a.threads)
    for m in _names(a.methods, list_pruners(), "method"):
        get_pruner(m)
    report = run(a)
    rows = report["rows"]
    print("\n" + format_rows(rows))
    goals = (report["protocol"] or {}).get("goals")
    if goals:
        print("\nprotocol goals: " + json.dumps({k: v for k, v in goals.items() if k != "select_median_ms"}))
    bad = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} rows ok on {report['device']} ({report['dtype']}), "
          f"{report['wall_s']:.0f} s" + (f"; report in {a.json}" if a.json else ""))
    if bad:
        print("failing rows:\n" + format_rows(bad))
    return 1 if bad or not rows else 0
