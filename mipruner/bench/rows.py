"""`python -m mipruner.bench rows`: a batch of rows through the decoding engine against transformers
`generate` on the same left-padded batch, and the same batch pruned, interleaved, at LLaVA-1.5's geometry.

The model is a random-weight LLaVA-1.5 at LLaVA-1.5-7B's widths by default: CLIP ViT-L/14-336 (24 x 1024,
576 visual tokens per image), a Llama of width 4096 (ffn 11008) and the checkpoint's vocabulary (32064
rows of the embedding and the LM head, so each decoded token pays the real head); the Llama's depth is
`--llm-layers` (default: 32 on CUDA, 2 elsewhere, the CPU proxy). `--tiny` shrinks every width (tests;
timings mean nothing). Each of `--batch` items gets its own image and one of four prompts, encoded once.
Cells, each answering every item with exactly `--new-tokens` tokens (EOS masked until then):
  generate   transformers: `model.generate` on inputs_embeds left-padded to the longest row, the 2-D mask,
             explicit positions, greedy, dynamic cache (what a user batching the model runs), unpruned
  ours       `mipruner.serve.batch.answer_items` of the unpruned rows (the decoding engine, the plain path)
  ours-mi@K  the same with every row pruned by MI (lambda 1) to `--budget` (64) visual tokens
After `--warmup` untimed rounds, `--repeats` rounds run every cell once, the order rotated each round.
Reported per cell: the median and 95% interval of the batch's time (`stats.median_ci`), items/s, memory
(CUDA: peak allocated; elsewhere the largest tensor any op returns, the quadratic term a packed (S, S)
mask used to add), and each cell's ratio to `generate` (ours / generate time, <= 1 is faster) printed
with its floor (`floors.floor_ratio`: the same ratio of the cells' floors, ms where the device's figures
are known, else FLOPs). Unpruned answers are compared with `generate`'s (equal rows counted).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from .floors import cell_floor, device_figures, device_name, floor_ratio
from .stats import METHOD, median_ci, ratio_text

PROMPTS = ["What is in the image?", "What colour is the square?", "Is there a cat?", "How many objects are there?"]
FULL = {"vision_layers": 24, "vision_width": 1024, "llm_width": 4096, "llm_ffn": 11008, "vocab_size": 32064}
TINY = {"vision_layers": 1, "vision_width": 64, "llm_width": 128, "llm_ffn": 256, "vocab_size": None}
MI = ("mi", {"lam": 1.0})


def _largest(fn) -> tuple[object, int]:
    """fn()'s result and the bytes of the largest tensor an aten op returned while it ran."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        top = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    Largest.top = max(Largest.top, t.numel() * t.element_size())
            return out

    with Largest():
        got = fn()
    return got, Largest.top


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m mipruner.bench rows", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--budget", type=int, default=64, help="visual tokens each row keeps in the pruned cell")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 20 on CUDA, 6 elsewhere)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"), help="default: bf16 on CUDA, else fp32")
    ap.add_argument("--tiny", action="store_true", help="tiny widths and the tokenizer's vocabulary (tests)")
    ap.add_argument("--llm-layers", type=int, default=None, help="the Llama's depth (default 32 on CUDA, 2 else)")
    for k in ("vision_layers", "vision_width", "llm_width", "llm_ffn", "vocab_size"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=None,
                        help=f"default {FULL[k]} ({TINY[k] or 'the tokenizer'}'s with --tiny)")
    ap.add_argument("--json", default=None, help="write the report here")
    a = ap.parse_args(argv)
    cuda = a.device.startswith("cuda")
    a.dtype = a.dtype or ("bf16" if cuda else "fp32")
    a.repeats = (20 if cuda else 6) if a.repeats is None else a.repeats
    a.llm_layers = a.llm_layers or (32 if cuda and not a.tiny else 2)
    for k, v in (TINY if a.tiny else FULL).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if min(a.batch, a.new_tokens, a.budget, a.repeats) < 1 or a.warmup < 0:
        raise SystemExit("--batch, --new-tokens, --budget and --repeats must be >= 1, --warmup >= 0")
    return a


def build_cells(ad, rows, pruned, n: int) -> dict:
    """name -> a call answering the batch (token ids per row)."""
    from mipruner.serve.batch import answer_items
    from mipruner.models.common.embeds_rows import batch_inputs

    force = dict(ad.fixed_length_kwargs(n))

    @torch.no_grad()
    def run_generate():
        b = batch_inputs(ad, rows)
        out = ad.model.generate(inputs_embeds=b["inputs_embeds"], attention_mask=b["attention_mask"],
                                position_ids=b["position_ids"], max_new_tokens=n, do_sample=False,
                                min_new_tokens=n, pad_token_id=ad.tokenizer.pad_token_id)
        return out.tolist(), [int(x) for x in b["attention_mask"].sum(1).tolist()]

    def ours(items):
        def run():
            got = answer_items(ad, items, max_new_tokens=n, max_batch=len(items), **force)
            return [g.token_ids for g in got], [g.input_tokens for g in got]
        return run

    return {"generate": run_generate, "ours": ours(rows), f"ours-mi@{pruned[0]}": ours(pruned[1])}


def main(argv=None) -> int:
    from PIL import Image

    import mipruner
    from mipruner.models.llava.random_weights import build_random_llava

    from .cli import DTYPES

    a = parse_args(argv)
    ad, desc = build_random_llava(vision_layers=a.vision_layers, vision_width=a.vision_width, llm_layers=a.llm_layers,
                                  llm_width=a.llm_width, llm_ffn=a.llm_ffn, vocab_size=a.vocab_size,
                                  dtype=DTYPES[a.dtype], device=a.device)
    desc += f", vocabulary {ad.model.get_output_embeddings().weight.shape[0]}"
    gen = torch.Generator().manual_seed(0)
    images = [Image.fromarray(torch.randint(0, 256, (336, 336, 3), generator=gen, dtype=torch.uint8).numpy())
              for _ in range(a.batch)]
    name, params = MI
    with torch.no_grad():
        encs = [mipruner.encode_for(ad, im, PROMPTS[i % len(PROMPTS)], [name]) for i, im in enumerate(images)]
        budget = min(a.budget, encs[0].n_visual)
        rows = [(e, None) for e in encs]
        pruned = (budget, [(e, mipruner.select(ad, e, name, budget, **params)) for e in encs])
    cells = build_cells(ad, rows, pruned, a.new_tokens)
    cuda = ad.device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(ad.device)

    answers, tokens, peak = {}, {}, {}
    for k, fn in cells.items():  # the first call of each: its answers, row lengths and memory
        if cuda:
            torch.cuda.reset_peak_memory_stats(ad.device)
            (answers[k], tokens[k]) = fn()
            sync()
            peak[k] = torch.cuda.max_memory_allocated(ad.device)
        else:
            (answers[k], tokens[k]), peak[k] = _largest(fn)
    names = list(cells)
    for _ in range(a.warmup):
        for k in names:
            cells[k]()
    times: dict = {k: [] for k in names}
    for r in range(a.repeats):
        for k in names[r % len(names):] + names[:r % len(names)]:  # rotated: each cell leads as often
            sync()
            t0 = time.perf_counter()
            cells[k]()
            sync()
            times[k].append((time.perf_counter() - t0) * 1e3)
    dev = device_figures(device_name(ad.device), a.dtype)
    report = {"command": "python -m mipruner.bench rows " + " ".join(argv or []), "model": desc,
              "device": dev["device"], "device_figures": dev["source"], "dtype": a.dtype, "batch": a.batch,
              "new_tokens": a.new_tokens, "budget": budget, "n_visual": encs[0].n_visual, "repeats": a.repeats,
              "warmup": a.warmup, "interval": METHOD, "cells": {}}
    for k in names:
        med = median_ci(times[k])
        report["cells"][k] = {"total_ms": med, "items_per_s": a.batch / med["median"] * 1e3,
                              "row_tokens": tokens[k], "memory_bytes": peak[k],
                              "floor": cell_floor(ad.config, dev, a.dtype, max(tokens[k]), a.new_tokens,
                                                  images=0, prompts=tokens[k])}
    base = report["cells"]["generate"]
    for k in names[1:]:
        c = report["cells"][k]
        c["vs_generate"] = round(c["total_ms"]["median"] / base["total_ms"]["median"], 3)
        c["vs_generate_floor"], c["floor_basis"] = floor_ratio(c["floor"], base["floor"], "total")
    report["answers_equal"] = sum(x == y for x, y in zip(answers["ours"], answers["generate"]))
    print(format_report(report, cuda))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"report in {a.json}")
    return 0


def format_report(report: dict, cuda: bool) -> str:
    from .latency_report import ci

    what = "peak allocated" if cuda else "largest tensor"
    lines = [f"{report['model']}; batch {report['batch']} rows of {report['n_visual']} visual tokens, "
             f"{report['new_tokens']} new tokens, {report['repeats']} rotated rounds after {report['warmup']} "
             f"warm-up rounds, {report['device']}; medians [95% {report['interval']}]",
             f"device figures: {report['device_figures']}"]
    base = report["cells"]["generate"]
    for k, c in report["cells"].items():
        line = (f"  {k:<12} {ci(c['total_ms'])} ms  {c['items_per_s']:8.2f} items/s  prompt tokens "
                f"{sum(c['row_tokens'])}  {what} {c['memory_bytes'] / 2 ** 20:9.2f} MiB")
        if k != "generate":
            fl = c["vs_generate_floor"]
            line += (f"  / generate: time {ratio_text(c['total_ms'], base['total_ms'])} "
                     f"[floor {'-' if fl is None else f'{fl:.3f}'} ({c['floor_basis']})]")
        lines.append(line)
    lines.append(f"  unpruned answers equal to generate's: {report['answers_equal']}/{report['batch']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
