"""`python -m tests.gpu_check run`: every family x media x registered method on one device, one report.

For each family of `mipruner.bench.zoo` (random weights at the real 7B / 2B-3B shapes; `--tiny`: a
few small layers, for CPU smoke runs) and each medium it takes (image; several images; a video of
8 frames), ONE encoding, then the keep-all anchor and every registered method (pre-LLM and in-LLM)
at two budgets given as shares of that encoding's N_V (`--shares`, default 0.25 and 0.1: K =
max(1, floor(share * N_V + 0.5)), so budgets scale with the shape): select, answer one by one, answer
batched as the app does (rows and columns: `tests/gpu_check/rows.py`). A failing row is
recorded with its error and the run goes on; a row whose logits hold NaN or inf fails.

`--isolate family` (the default on CUDA; `auto`) runs each family in its own process
(`tests/gpu_check/procs.py`): a CUDA fault or an abort costs that family's unfinished rows, each marked
with the cause, and the other families still run; the failed family's unfinished media are tried
once more with CUDA_LAUNCH_BLOCKING=1. `--isolate none` (the default on the CPU) runs everything in
this process, freeing each model (and torch.compile's caches) before the next family.

`--protocol` (default: on on CUDA, off on the CPU) then, after every row, times the paper's protocol
of `bench gpu` on a LLaVA-1.5 model (its own process when isolated), within `--budget-s` seconds
(default 200): 5 timed runs after 2 warm-ups per cell, cells in priority order, a cell started only
when its estimate fits the budget left (`tests/gpu_check/protocol.py`). `--cells` picks the
cells (select, latency, batch, view, compiled); `--protocol-only` runs no rows.

The report is rewritten after every row and protocol cell, so a command stopped at a time limit still
leaves every finished row in `--json`. Splitting the check into commands that fit a lent machine's
per-call limit, and merging their reports, is a maintainers' tool outside the package
(`python -m tests.gpu_check plan|merge` in a checkout).

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

from mipruner.bench.floors import device_name
from mipruner.bench.zoo import FAMILIES, PROMPTS, get_family, make_media
from mipruner.pruners import get_pruner, list_pruners

from .protocol import CELLS
from .rows import Clock, DeviceFault, check_media, last_line, planned_rows, summary

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _names(text: str | None, known: list[str], what: str) -> list[str]:
    if not text or text.strip() == "all":
        return list(known)
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in known:
            raise SystemExit(f"unknown {what} {n!r}; choose from {', '.join(known)}")
    return names


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m tests.gpu_check run", description=__doc__,
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
    p.add_argument("--cells", default="all", help="protocol: 'all' or some of " + ",".join(CELLS) + " (select: every "
                   "method's selection; latency: batch 1 vs plain generate; batch: items/s at batch 1, 8, 32; view: six "
                   "answers vs one; compiled: latency and batch on the compiled GPU path)")
    p.add_argument("--protocol-only", action="store_true", help="no rows: the protocol alone (implies --protocol)")
    p.add_argument("--isolate", default="auto", choices=("auto", "family", "none"),
                   help="family: each family in its own process (a CUDA fault or abort costs only its rows; one retry "
                        "with CUDA_LAUNCH_BLOCKING=1); none: one process; auto (default): family on CUDA, none elsewhere")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one family's process (procs.py)
    return p.parse_args(argv)


def settings(a) -> argparse.Namespace:
    """The run's resolved settings (device, dtype, protocol, names checked), shared by every mode."""
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.llm_layers is not None and a.llm_layers < 1:
        raise SystemExit(f"--llm-layers must be at least 1, got {a.llm_layers}")
    shares = [float(s) for s in a.shares.split(",") if s.strip()]
    if not shares or any(not 0 < s <= 1 for s in shares):
        raise SystemExit(f"--shares must be shares in (0, 1], got {a.shares!r}")
    protocol = a.protocol_only or ((device.type == "cuda") if a.protocol is None else a.protocol)
    isolate = a.isolate if a.isolate != "auto" else ("family" if device.type == "cuda" else "none")
    return argparse.Namespace(
        device=device, dtype=a.dtype or ("bf16" if device.type == "cuda" else "fp32"), protocol=protocol,
        families=_names(a.families, list(FAMILIES), "family"), methods=_names(a.methods, list_pruners(), "method"),
        media=_names(a.media, ["image", "images", "video"], "medium"), shares=shares,
        cells=_names(a.cells, list(CELLS), "protocol cell"), isolate=isolate)


def new_report(a, s) -> dict:
    import transformers

    return {"device": device_name(s.device), "torch": torch.__version__, "transformers": transformers.__version__,
            "dtype": s.dtype, "tiny": bool(a.tiny), "llm_layers": a.llm_layers,
            "command": "python -m tests.gpu_check run " + " ".join(sys.argv[1:] if a.command is None else a.command),
            "shares": s.shares, "new_tokens": a.new_tokens, "static_cache": bool(a.static_cache),
            "methods": s.methods, "families": [], "rows": [], "protocol": None}


def _free(device: torch.device) -> None:
    torch.compiler.reset()  # dynamo's caches and guards hold the freed model's tensors; the next phase starts clean
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def run(a, log=print) -> dict:
    s = settings(a)
    report = new_report(a, s)
    t_start = time.monotonic()

    def save():
        report["wall_s"] = round(time.monotonic() - t_start, 1)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(report, f, indent=1)

    if s.isolate == "family" and not a.child:
        from .procs import run_isolated

        run_isolated(a, s, report, save, log)
        save()
        return report
    clock = Clock(s.device)
    for i, name in enumerate([] if a.protocol_only else s.families):
        try:
            _family(a, s, name, report, save, clock, log)
        except DeviceFault as e:  # this process's CUDA context is gone: no later row can run in it
            if a.child:  # the parent reads the rows in flight, marks the rest and retries
                save()
                print(f"CUDA fault: {e}", flush=True)
                raise SystemExit(3)
            report["rows"] += _fault_rows(report.pop("in_flight"), s, name, s.families[i + 1:], str(e))
            save()
            return report
        _free(s.device)
    if s.protocol:
        adapter, _ = get_family("llava").build(tiny=a.tiny, device=s.device, dtype=DTYPES[s.dtype], seed=a.seed,
                                              llm_layers=a.llm_layers)
        report["protocol"] = _protocol(adapter, a, s, log, lambda p: (report.update(protocol=p), save()))
        del adapter
        _free(s.device)
    save()
    return report


def _family(a, s, name: str, report: dict, save, clock: Clock, log) -> None:
    """Build one family's model, then every (media) of it: the rows appended to `report` as each
    medium ends; while a medium runs, `report["in_flight"]` holds its rows so far (saved before
    each row in a family's own process, so the parent knows which row a crash stopped)."""
    fam = get_family(name)
    kinds = [k for k in fam.media if k in s.media]
    t0 = time.monotonic()
    try:
        adapter, desc = fam.build(tiny=a.tiny, device=s.device, dtype=DTYPES[s.dtype], seed=a.seed,
                                  llm_layers=a.llm_layers)
        if a.static_cache:
            from mipruner.serve.batch import use_decode_path

            use_decode_path(adapter, bucket=64, static_cache=True)
    except Exception as e:  # noqa: BLE001  (every row of the family fails with the reason)
        err = f"building the model failed: {last_line(e)}"
        log(f"{name}: {err}")
        for k in kinds:
            report["rows"] += planned_rows(name, k, s.methods, s.shares, err)
            report["families"].append({"family": name, "media": k, "error": err})
        save()
        return
    log(f"{name}: {desc} (built in {time.monotonic() - t0:.1f} s)")
    for k in kinds:
        partial: list = []
        report["in_flight"] = {"family": name, "media": k, "rows": partial}

        def on_row(r, partial=partial):
            partial.append(r)
            if a.child:
                save()

        medium = make_media(k, a.tiny, fam.video_frames)
        rows, info = check_media(adapter, name, k, medium, PROMPTS[k], s.methods, s.shares, a.new_tokens, clock,
                                 log=log, on_row=on_row)
        del report["in_flight"]
        report["rows"] += rows
        report["families"].append(dict(info, description=desc))
        save()
    del adapter


def _fault_rows(in_flight: dict, s, name: str, later: list[str], cause: str) -> list[dict]:
    """After a CUDA fault in (name, in_flight media): its finished rows, then every row not run."""
    rows = list(in_flight["rows"])
    fam = get_family(name)
    kinds = [k for k in fam.media if k in s.media]
    todo = planned_rows(name, in_flight["media"], s.methods, s.shares)[len(rows):]
    todo += [r for k in kinds[kinds.index(in_flight["media"]) + 1:] for r in planned_rows(name, k, s.methods, s.shares)]
    todo += [r for f in later for k in get_family(f).media if k in s.media for r in planned_rows(f, k, s.methods, s.shares)]
    for r in todo:
        r["error"] = f"not run: a CUDA fault ended this process's CUDA context ({cause})"
    return rows + todo


def _protocol(adapter, a, s, log, progress) -> dict:
    from .protocol import run_protocol

    try:
        return run_protocol(adapter, budget_s=a.budget_s, repeats=a.repeats, warmup=a.warmup, log=log,
                            progress=progress, groups=s.cells)
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
    if a.child:  # one family's process: the parent prints the table
        return 0
    return summary(report, a.json)
