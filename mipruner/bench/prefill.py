"""`python -m mipruner.bench prefill`: vision encode, prefill at keep 100/50/25/10 %, overhead.

For each keep share: the prefill time (one forward over the pruned prompt), its speedup over the
unpruned prefill against the token-ratio ideal (L_full / L_kept), and the pruning overhead
(MI scoring + selection + building the LLM inputs) as a share of the unpruned prefill. All in
one run, medians over --repeats. `--model random` builds a realistic-shaped random-weight LLaVA
(CLIP ViT-L/14-336 tower + 4-layer Llama-4096, bf16) in memory: no download needed.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from PIL import Image

import mipruner

from .timing import measure, median_ms, table


def test_image(size: int = 336, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 255, size=(size, size, 3), dtype=np.uint8)
    a[size // 4: size // 2, size // 4: size // 2] = (220, 30, 30)
    return Image.fromarray(a)


def run(adapter, shares=(1.0, 0.5, 0.25, 0.1), repeats: int = 5, method: str = "mi", lam: float = 1.0,
        prompt: str = "what is in the image? describe the red square.", log=print) -> list[dict]:
    image = test_image(int(getattr(adapter.config.vision_config, "image_size", 336)))
    enc = adapter.encode(image, prompt)
    encode_ms = median_ms(measure(lambda: adapter.encode(image, prompt), repeats, budget_s=60))
    full_ms = median_ms(measure(lambda: adapter.prefill_logits(enc), repeats, budget_s=60))
    L = enc.n_visual + enc.text.shape[0]
    rows, out = [], []
    with torch.inference_mode():
        for share in shares:
            kw = {"lam": lam} if method in ("mi", "mi_attention") else {}

            def select():
                return mipruner.prune(method, visual=enc.visual, text=enc.scoring_text, budget=share, **kw)

            sel = select()
            keep = None if share == 1.0 else sel
            prune_ms = 0.0 if share == 1.0 else median_ms(measure(select, max(repeats, 9)))
            build_ms = median_ms(measure(lambda: adapter.pruned_inputs(enc, keep), max(repeats, 9)))
            pre_ms = median_ms(measure(lambda: adapter.prefill_logits(enc, keep), repeats, budget_s=60))
            L_kept = L - (enc.n_visual - sel.budget) if share < 1.0 else L
            ideal = L / L_kept
            speed = full_ms / pre_ms
            overhead = (prune_ms + build_ms) / full_ms
            rows.append([f"{share:.0%}", str(L_kept), f"{pre_ms:.1f}", f"{speed:.2f}", f"{ideal:.2f}",
                         f"{speed / ideal:.0%}", f"{prune_ms:.2f}", f"{build_ms:.2f}", f"{overhead:.2%}"])
            out.append(dict(keep=share, llm_tokens=L_kept, prefill_ms=pre_ms, speedup=speed, ideal=ideal,
                            prune_ms=prune_ms, build_ms=build_ms, overhead=overhead))
    log(f"vision encode (+ processor, embeddings): {encode_ms:.1f} ms;  unpruned prefill: {full_ms:.1f} ms "
        f"over {L} tokens ({enc.n_visual} visual);  method {method}  (torch threads: {torch.get_num_threads()})")
    log(table(rows, ["keep", "LLM tokens", "prefill ms", "speedup", "ideal", "of ideal", "prune ms",
                     "inputs ms", "overhead"]))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m mipruner.bench prefill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="random", help="'random' (built in memory), a path, hub id or alias")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    p.add_argument("--device", default=None)
    p.add_argument("--method", default="mi")
    p.add_argument("--lam", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--llm-layers", type=int, default=4, help="random model only")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    t0 = time.perf_counter()
    if a.model == "random":
        from mipruner.models.llava.random_weights import build_random_llava

        adapter, desc = build_random_llava(llm_layers=a.llm_layers, dtype=dtype)
    else:
        adapter, desc = mipruner.load(a.model, device=a.device, dtype=dtype), a.model
    print(f"model: {desc}  (built/loaded in {time.perf_counter() - t0:.0f} s)")
    run(adapter, repeats=a.repeats, method=a.method, lam=a.lam)
