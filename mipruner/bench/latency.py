"""`python -m mipruner.bench latency`: what a user waits for, against the baselines a user would pick and the floor.

On gpu-check's LLaVA-1.5 model (LLaVA-1.5-7B shape, random weights; `--llm-layers N` keeps the shape with N
decoder layers, `--tiny` shrinks it), for each answer length of `--lengths` (2, 32, 128 new tokens):
  eager phase     generate (transformers: processor + `model.generate`, dynamic cache), ours unpruned, ours
                  MI lambda 1 at `--budget` (64) tokens; plain path
  compiled phase  generate-static (`cache_implementation="static"`: transformers compiles its decoding
                  step on CUDA, the best it offers), ours unpruned and ours MI on our GPU decoding path
                  (static cache, compiled prefill and step; lengths bucketed to 64 on CUDA only: off
                  CUDA nothing compiles and nothing is padded, `compiled_path`), and the app's view
                  there: one answer vs the six answers of one view
  `--batch B`     items/s of B items: generate (eager and static), ours unpruned, ours MI; and the
                  encode per image at batch 1 and B (`--batch 0`: none; 32 on CUDA, 0 elsewhere)
  select          every pre-LLM selection at `--budget` of N_V (its median over the timed runs); MI with
                  lambda 1, the selection the MI cells time end to end
Cells are interleaved within the group they are compared in (one answer length: generate, ours, the
view; or the batch and encode cells): after `--warmup` untimed rounds (every cell sees every image and
prompt, so every shape compiles there), each of `--repeats` rounds (30 on CUDA, 6 elsewhere) runs every
cell of the group once, in turn, on that round's image and prompt (`--inputs` varied pairs). A group
runs after the other, so cells of other lengths do not evict each other's static caches. Per cell: median and a
95% interval (`stats.METHOD`) of the total, the time to first token and the per-token decode time
(CUDA events), the compile count (dynamo's unique graphs during its warm-up and during its timed runs),
the memory reserved (CUDA: the peak of `torch.cuda.memory_reserved` during its runs, process-wide, CUDA
graph pools included) and its floor (`floors.cell_floor` from the device's figures, source printed).
Parts of a run are timed between their own marks (`select_ms`: encoded to selected). The goals of
issues 40 and 41 are restated against these anchors (`latency_report.goals`), each ratio taken between
cells of one interleaved group and printed with its floor (`floors.floor_ratio`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from mipruner.serve.batch import use_decode_path
from mipruner.pruners import get_pruner, list_pruners

from . import latency_runs as R
from .floors import cell_floor, device_figures, device_name
from .latency_report import format_report, goals
from .prefill import test_image
from .stats import METHOD, median_ci

PROMPTS = ("what is in the image?", "describe the red square and what surrounds it.",
           "is there anything unusual in this picture? answer in one sentence.",
           "list the colours you can see, from the largest area to the smallest, and say where each one is.")
VIEW = ("mi", "random", "similarity", "attention", "divprune")
MI = ("mi", {"lam": 1.0})


def inputs(k: int, size: int) -> list[tuple]:
    """k (image, prompt) pairs: pictures of other seeds and aspect ratios, prompts of other lengths."""
    shapes = [(size, size), (size * 4 // 3, size), (size, size * 3 // 2), (size * 2, size * 3 // 2)]
    out = []
    for i in range(k):
        w, h = shapes[i % len(shapes)]
        out.append((test_image(max(w, h), seed=i).resize((w, h)), PROMPTS[i % len(PROMPTS)]))
    return out


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run_phase(cells: list[dict], pairs: list[tuple], repeats: int, warmup: int, clock, log=print) -> None:
    """Warm every cell, then `repeats` interleaved rounds; each cell gets its `runs`, compiles and memory."""
    cuda = clock.cuda
    for c in cells:
        g0 = _graphs()
        for i in range(warmup):
            c["run"](*pairs[i % len(pairs)])
        c.update(runs=[], compiles_warmup=_graphs() - g0, compiles_timed=0, reserved_mb=None)
    for r in range(repeats):
        image, prompt = pairs[r % len(pairs)]
        for c in cells:
            g0 = _graphs()
            if cuda:
                torch.cuda.reset_peak_memory_stats(clock.device)
            c["runs"].append(c["run"](image, prompt))
            c["compiles_timed"] += _graphs() - g0
            if cuda:
                mb = torch.cuda.max_memory_reserved(clock.device) / 2 ** 20
                c["reserved_mb"] = max(c["reserved_mb"] or 0.0, round(mb, 1))
        log(f"  round {r + 1}/{repeats}: " + ", ".join(f"{c['name']} {c['runs'][-1]['total_ms']:.0f}" for c in cells))


def summarize(c: dict) -> dict:
    """A cell's report entry: medians with intervals of its parts, counts, memory."""
    out = {k: c[k] for k in ("name", "phase", "kind", "method", "budget", "length", "batch", "group",
                             "compiles_warmup", "compiles_timed", "reserved_mb")}
    for key in ("total_ms", "ttft_ms", "decode_ms_per_token", "per_image_ms", "encode_ms", "select_ms"):
        vals = [x[key] for x in c["runs"] if x.get(key) is not None]
        if vals:
            out[key] = median_ci(vals)
    runs = sorted((x for x in c["runs"] if x.get("prompt_tokens") is not None), key=lambda x: x["prompt_tokens"])
    mid = runs[len(runs) // 2] if runs else {}
    out["prompt_tokens"] = mid.get("prompt_tokens")
    if mid.get("row_tokens"):  # rows of differing lengths (the view): those of the median run
        out["row_tokens"] = list(mid["row_tokens"])
    out["new_tokens"] = sorted({x["new_tokens"] for x in c["runs"] if x.get("new_tokens") is not None})
    return out


def build_cells(adapter, clock, a, budget: int, phase: str) -> list[dict]:
    name, params = MI
    cells = []

    def add(kind, method, length, batch, run, bud="all"):
        label = f"{kind} {method}" + (f"@{bud}" if bud != "all" else "") + f" n={length}" + (
            f" x{batch}" if batch > 1 else "")
        group = "batch" if kind in ("batch", "encode") else f"n={length}"  # the cells compared with each other
        cells.append({"name": label, "phase": phase, "kind": kind, "method": method, "budget": bud, "length": length,
                      "batch": batch, "group": group, "run": run})

    view = [m for m in VIEW if m in list_pruners()]
    static = phase == "compiled"
    for n in a.lengths:
        add("latency", "generate-static" if static else "generate", n, 1, R.plain(adapter, clock, n, static=static))
        add("latency", "ours-none", n, 1, R.ours(adapter, clock, n, "none", "all", {}))
        add("latency", "ours-mi", n, 1, R.ours(adapter, clock, n, name, budget, params), budget)
        if static and n in a.view_lengths:
            add("view", "one answer", n, 1, R.view(adapter, clock, n, view, budget, True, alone=True))
            add("view", f"{len(view) + 1} answers", n, len(view) + 1, R.view(adapter, clock, n, view, budget, True),
                budget)
    if a.batch:
        n = a.lengths[0]
        add("batch", "generate-static" if static else "generate", n, a.batch,
            R.plain(adapter, clock, n, a.batch, static=static))
        add("batch", "ours-none", n, a.batch, R.batch(adapter, clock, n, "none", "all", {}, a.batch))
        add("batch", "ours-mi", n, a.batch, R.batch(adapter, clock, n, name, budget, params, a.batch), budget)
        if not static:
            for b in (1, a.batch):
                add("encode", "encode_items", 0, b, R.encode(adapter, clock, b))
    return cells


def select_cells(adapter, clock, pairs, budget: int, repeats: int) -> list[dict]:
    """Every pre-LLM image selection (the video methods: `--video-frames`) at `budget` of N_V on one cached
    encoding (cold cache per call); MI with the settings of the end-to-end MI cells (`MI`: lambda 1), so the
    selection timed here is the one timed there."""
    import mipruner
    from mipruner.pruners.video import NotApplicable

    image, prompt = pairs[0]
    # the video methods select along time and do not apply to an image: `--video-frames` times them
    methods = [m for m in list_pruners() if get_pruner(m).stage != "llm" and not get_pruner(m).video]
    enc = mipruner.encode_for(adapter, image, prompt, methods)
    methods = [m for m in methods if enc.is_video or not get_pruner(m).video]  # a video method needs a video
    out = []
    for m in methods:
        params = dict(MI[1]) if m == MI[0] else {}
        try:
            mipruner.select(adapter, enc, m, budget, cache={}, strict=False, **params)
        except NotApplicable:  # a video method on this image: no cell (its sentence says why)
            continue
        times = []
        for _ in range(repeats):
            t0 = clock.mark()
            mipruner.select(adapter, enc, m, budget, cache={}, strict=False, **params)
            t1 = clock.mark()
            clock.sync()
            times.append(clock.ms(t0, t1))
        label = m + "".join(f" {k}={v:g}" for k, v in params.items())
        out.append({"name": f"select {label}", "phase": "eager", "kind": "select", "method": m, "label": label,
                    "params": params, "budget": budget, "n_visual": enc.n_visual, "total_ms": median_ci(times)})
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m mipruner.bench latency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"), help="default: bf16 on cuda, else fp32")
    p.add_argument("--tiny", action="store_true", help="tiny widths (tests; timings mean nothing)")
    p.add_argument("--llm-layers", type=int, default=None, metavar="N", help="the LLM's depth (CPU proxy: 2)")
    p.add_argument("--lengths", default="2,32,128", help="answer lengths in new tokens")
    p.add_argument("--view-lengths", default="2,32", help="answer lengths of the view cells (of --lengths)")
    p.add_argument("--phases", default="eager,compiled", help="eager, compiled or both")
    p.add_argument("--budget", type=int, default=64, help="kept tokens of MI and the view's methods")
    p.add_argument("--batch", type=int, default=None, help="items of the batch cells (default 32 on cuda, 0 else)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved timed rounds (default 30 on cuda, 6 else)")
    p.add_argument("--warmup", type=int, default=None, help="untimed rounds (default: --inputs)")
    p.add_argument("--inputs", type=int, default=4, help="varied (image, prompt) pairs, taken in turn")
    p.add_argument("--no-select", dest="select", action="store_false", help="skip the selection cells")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's peak dense TFLOP/s in --dtype")
    p.add_argument("--bandwidth-gbs", type=float, default=None, help="the device's memory bandwidth in GB/s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--json", help="write the report here (rewritten after every group of cells)")
    p.add_argument("--video-frames", default=None, help="e.g. 8,16,32: the video cells instead "
                   "(mipruner.bench.latency_video: the video methods' selection against the prefill they save, "
                   "EVS's time to first token)")
    p.add_argument("--video-family", default="qwen2_5_vl", help="with --video-frames: qwen2_5_vl or llava_onevision")
    p.add_argument("--video-size", default=None, help="with --video-frames: the frames' WxH (default 448x336, "
                   "112x84 with --tiny); the processor decides the tokens")
    p.add_argument("--vision-layers", type=int, default=None, metavar="N", help="with --video-frames: the tower's "
                   "first N blocks only (CPU proxy; default: all)")
    p.add_argument("--ttft-frames", default=None, help="with --video-frames: the frame counts of the time-to-first-"
                   "token cells (default: the first of --video-frames; 0: none)")
    a = p.parse_args(argv)
    a.device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = a.device.type == "cuda"
    a.dtype = a.dtype or ("bf16" if cuda else "fp32")
    a.lengths = [int(x) for x in a.lengths.split(",") if x.strip()]
    a.view_lengths = [int(x) for x in a.view_lengths.split(",") if x.strip()]
    a.phases = [x.strip() for x in a.phases.split(",") if x.strip()]
    a.batch = (32 if cuda else 0) if a.batch is None else a.batch
    a.repeats = (30 if cuda else 6) if a.repeats is None else a.repeats
    if a.video_frames:  # one video per frame count: one warm-up round by default
        from .video import parse_frames, parse_size

        a.video_frames, a.video_size = parse_frames(a.video_frames), parse_size(a.video_size)
        a.ttft_frames = a.video_frames[:1] if a.ttft_frames is None else [
            int(x) for x in a.ttft_frames.split(",") if x.strip()]
        a.warmup = 1 if a.warmup is None else a.warmup
    a.warmup = a.inputs if a.warmup is None else a.warmup
    if not a.lengths or min(a.lengths) < 1 or set(a.phases) - {"eager", "compiled"} or a.inputs < 1 or a.repeats < 1:
        raise SystemExit("--lengths must be positive, --phases of eager,compiled, --inputs and --repeats >= 1")
    return a


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    import transformers

    from .cli import DTYPES
    from .zoo import get_family

    t_start = time.monotonic()
    if a.video_frames:
        return main_video(a, argv, t_start)
    adapter, desc = get_family("llava").build(tiny=a.tiny, device=a.device, dtype=DTYPES[a.dtype], seed=a.seed,
                                              llm_layers=a.llm_layers)
    clock = R.Clock(a.device)
    size = int(adapter.config.vision_config.image_size)
    pairs = inputs(a.inputs, size)
    n_v = _n_visual(adapter, pairs[0])
    budget = min(a.budget, max(1, n_v // 4))
    dev = device_figures(device_name(a.device), a.dtype, a.peak_tflops, a.bandwidth_gbs)
    report = {"command": "python -m mipruner.bench latency " + " ".join(argv), "device": dev["device"],
              "device_figures": dev, "torch": torch.__version__, "transformers": transformers.__version__,
              "dtype": a.dtype, "model": desc, "n_visual": n_v, "budget": budget, "lengths": a.lengths,
              "repeats": a.repeats, "warmup": a.warmup, "inputs": a.inputs, "interval": METHOD,
              "timer": "CUDA events" if clock.cuda else "time.perf_counter", "compiled_path": compiled_path(a.device),
              "cells": []}

    def save():
        report["wall_s"] = round(time.monotonic() - t_start, 1)
        report["goals"] = goals(report["cells"])
        if a.json:
            with open(a.json, "w") as f:
                json.dump(report, f, indent=1)

    print(f"model: {desc}; N_V {n_v}, budget {budget}; device figures: {dev['source']}")
    with torch.inference_mode():
        if a.select:
            report["cells"] += select_cells(adapter, clock, pairs, budget, max(a.repeats, 3))
    for phase in a.phases:
        if phase == "compiled":
            torch.compiler.reset()
            use_decode_path(adapter, **report["compiled_path"])
        ctx = torch.no_grad() if phase == "compiled" else torch.inference_mode()
        with ctx:
            cells = build_cells(adapter, clock, a, budget, phase)
            for group in dict.fromkeys(c["group"] for c in cells):
                mine = [c for c in cells if c["group"] == group]
                print(f"{phase} {group}: {len(mine)} cells, {a.warmup} warm-up rounds, {a.repeats} interleaved rounds")
                run_phase(mine, pairs, a.repeats, a.warmup, clock)
                for c in mine:  # saved after every group: a run stopped by its time limit keeps the groups it ran
                    s = summarize(c)
                    if s.get("prompt_tokens") and c["kind"] in ("latency", "batch", "view"):
                        s["floor"] = cell_floor(adapter.config, dev, a.dtype, s["prompt_tokens"], c["length"],
                                                rows=c["batch"] if c["kind"] == "batch" else 1,
                                                images=0 if c["kind"] == "view" else 1, prompts=s.get("row_tokens"))
                    report["cells"].append(s)
                save()
        if phase == "compiled":
            use_decode_path(adapter)
            torch.compiler.reset()
        save()
    save()
    print(format_report(report))
    if a.json:
        print(f"report in {a.json}")
    return 0


def main_video(a, argv, t_start) -> int:
    """`--video-frames`: the video report (`latency_video`)."""
    import transformers

    from . import latency_video as LV

    dev = device_figures(device_name(a.device), a.dtype, a.peak_tflops, a.bandwidth_gbs)
    report = {"command": "python -m mipruner.bench latency " + " ".join(argv), "device": dev["device"],
              "device_figures": dev, "torch": torch.__version__, "transformers": transformers.__version__,
              "dtype": a.dtype, "lengths": a.lengths[:1], "repeats": a.repeats, "warmup": a.warmup, "interval": METHOD,
              "timer": "CUDA events" if a.device.type == "cuda" else "time.perf_counter",
              "threads": torch.get_num_threads(), "cells": []}

    def save():
        report["wall_s"] = round(time.monotonic() - t_start, 1)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(report, f, indent=1)

    LV.run(a, report, dev, R.Clock(a.device), save, run_phase, summarize)
    save()
    print(LV.format_video(report))
    if a.json:
        print(f"report in {a.json}")
    return 0


def compiled_path(device: torch.device) -> dict:
    """The compiled phase's decoding path: our GPU path (static cache, compiled prefill and step). Prompts are
    padded to 64-token buckets only where something compiles (CUDA), so that compiled shapes are few; on the
    CPU nothing compiles and no padding is added, so the phase measures the static cache and pruning alone."""
    return {"bucket": 64 if device.type == "cuda" else 0, "static_cache": True, "compile": True}


def _n_visual(adapter, pair) -> int:
    return int(adapter.encode(pair[0], pair[1]).n_visual)
