"""`python -m mipruner.bench slider`: server-side time of one slider update (prune + render).

A slider move re-runs `ModelService.view` on a cached encoding: each method prunes (MI reuses its
per-encoding cache) and renders its panel (kept mask, score or PMI heatmap, pivot map for MI).
No encode and no LLM: the encodings are synthetic `Encoded` records built without a model:

  image: N_V = 576 (24 x 24 grid of 14 px boxes on a 336 px image), d = 4096   goal < 100 ms
  video: 8 frames x 256 (16 x 16 grid of 14 px boxes on 224 px frames), d = 4096 goal < 300 ms

Each repeat moves the budget by one token, so nothing is served from an answer cache; the first
update (cache fill, layout build) is reported separately as "first". "+ image encoding" adds what
the app's server does next with the panel images: encode each one (Gradio writes them to its
cache in the panels' format, `IMAGE_FORMAT` in components/page/panels.py, JPEG), so it is the server
time of one update short of Gradio's own bookkeeping.
On a 2-core machine shared with another busy process, torch's default of 2 threads oversubscribes
the cores and times grow 3-5x; `--threads 1` measures the code rather than the contention.
"""
from __future__ import annotations

import io
import statistics
import time

import numpy as np
import torch
from PIL import Image

from mipruner.models.base import Adapter, Encoded, TokenGeometry

from .cli import add_run_options, command_parser, names, parse
from .timing import table

GOALS_MS = {"image": 100.0, "video": 300.0}
PANEL_FORMAT = "jpeg"  # = components.page.panels.IMAGE_FORMAT (a test keeps them equal)


def synthetic_encoded(n_frames: int, grid: int, size: int, dim: int = 4096, n_text: int = 12,
                      seed: int = 0) -> Encoded:
    """An Encoded of `n_frames` frames of `grid x grid` tokens on `size` px frames: random tensors."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    n = n_frames * grid * grid
    cell = size / grid
    f, r, c = torch.meshgrid(torch.arange(n_frames), torch.arange(grid), torch.arange(grid), indexing="ij")
    f, r, c = f.flatten(), r.flatten(), c.flatten()  # (N_V,) each
    box = torch.stack([c * cell, r * cell, (c + 1) * cell, (r + 1) * cell], dim=1).float()  # (N_V, 4)
    geo = TokenGeometry(frame=f, row=r, col=c, box=box, kind=["patch"] * n, grids=[(grid, grid)] * n_frames,
                        sizes=[(size, size)] * n_frames)
    frames = [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(n_frames)]
    tokens = ["USER", ":"] + [f"word{i}" for i in range(n_text)] + ["ASSISTANT", ":"]
    mask = torch.tensor([t.startswith("word") for t in tokens])
    return Encoded(model="synthetic", prompt=" ".join(tokens[2:-2]), visual=torch.randn(n, dim, generator=g),
                   geometry=geo, text=torch.randn(len(tokens), dim, generator=g), text_tokens=tokens,
                   text_mask=mask, text_mode="question", frames=frames, is_video=n_frames > 1)


class FixedAdapter(Adapter):
    """An adapter that hands back one prebuilt encoding (no model): for timing the engine."""

    family = "fixed"

    def __init__(self, encoded: Encoded):
        self.encoded, self.name = encoded, "synthetic"

    @classmethod
    def from_pretrained(cls, path, device=None, dtype=None, **kwargs):
        raise NotImplementedError

    def encode(self, media, prompt, *, text_mode="question", need_attention=False):
        return self.encoded

    def prefill_logits(self, encoded, keep=None):
        raise NotImplementedError

    def generate(self, encoded, keep=None, max_new_tokens=64, **gen):
        raise NotImplementedError


CASES = {"image": dict(n_frames=1, grid=24, size=336, budget=64),
         "video": dict(n_frames=8, grid=16, size=224, budget=227)}  # paper budgets (Sec. 4)


def run(cases, methods, repeats: int, dim: int, lam: float, log=print) -> list[dict]:
    from mipruner.serve.service import ModelService, Panel

    results = []
    for case in cases:
        cfg = CASES[case]
        enc = synthetic_encoded(cfg["n_frames"], cfg["grid"], cfg["size"], dim=dim)
        engine = ModelService(FixedAdapter(enc))
        session = engine.new_session()
        key = engine.encode(session, enc.frames, enc.prompt)
        panels = [Panel(m) for m in methods]
        params = {"lam": lam, "seed": 0}
        t0 = time.perf_counter()
        engine.view(session, key, panels, cfg["budget"], params, heat_token=0)  # fills MI cache + layout
        first = (time.perf_counter() - t0) * 1e3
        totals, with_png, per = [], [], {m: ([], []) for m in methods}
        for i in range(repeats):
            b = cfg["budget"] + 1 + i  # a slider move
            t0 = time.perf_counter()
            views = engine.view(session, key, panels, b, params, heat_token=i % 4)
            t1 = time.perf_counter()
            for v in views:
                for img in (v.mask, v.heatmap, v.pivot):
                    if img is not None:
                        img.save(io.BytesIO(), format=PANEL_FORMAT)
            totals.append((t1 - t0) * 1e3)
            with_png.append((time.perf_counter() - t0) * 1e3)
            for v in views:
                per[v.method][0].append(v.prune_ms)
                per[v.method][1].append(v.render_ms)
        med, med_png = statistics.median(totals), statistics.median(with_png)
        rows = [[m, f"{statistics.median(p):.1f}", f"{statistics.median(rr):.1f}"] for m, (p, rr) in per.items()]
        rows.append(["total (one update)", "", f"{med:.1f}"])
        rows.append([f"total + {PANEL_FORMAT} encoding", "", f"{med_png:.1f}"])
        goal = GOALS_MS[case]
        log(f"\n{case}: N_V={enc.n_visual} ({cfg['n_frames']} x {cfg['grid']}x{cfg['grid']}, {cfg['size']} px)  "
            f"d={dim}  K={cfg['budget']}+  lam={lam}  repeats={repeats}  threads={torch.get_num_threads()}")
        log(table(rows, ["method", "prune ms", "render ms"]))
        log(f"first update (MI cache + layout): {first:.1f} ms; median update {med:.1f} ms, with image encoding "
            f"{med_png:.1f} ms; goal < {goal:.0f} ms: {'met' if med_png < goal else 'MISSED'}")
        results.append(dict(case=case, n_v=enc.n_visual, median_ms=med, median_encoded_ms=med_png, first_ms=first,
                            goal_ms=goal,
                            per_method={m: dict(prune_ms=statistics.median(p), render_ms=statistics.median(rr))
                                        for m, (p, rr) in per.items()}))
    return results


def main(argv=None) -> None:
    p = command_parser("slider", __doc__)
    p.add_argument("--cases", default="image,video", help="comma-separated: image, video")
    p.add_argument("--methods", default="mi,random,similarity")
    add_run_options(p, repeats=15)
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--lam", type=float, default=0.5, help="MI lambda (0.5: the greedy path)")
    a = parse(p, argv)
    cases = names(a.cases)
    for c in cases:
        if c not in CASES:
            p.error(f"unknown case {c!r}; known: {', '.join(CASES)}")
    run(cases, names(a.methods), a.repeats, a.dim, a.lam)
