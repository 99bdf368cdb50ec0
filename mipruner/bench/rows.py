"""`python -m mipruner.bench rows`: a batch of unpruned rows through the decoding engine against
transformers `generate` on the same left-padded batch, interleaved, at LLaVA-1.5's geometry.

The model is a random-weight LLaVA-1.5 (CLIP at 336 px, patch 14: 576 visual tokens per image; the tower's
and the Llama's depth and width set by the options, the real 7B shape by default on CUDA). Each of
`--batch` items gets its own image and one of four prompts; all rows are unpruned. Per repeat, in
alternating order: `generate` (inputs_embeds left-padded to the longest row, the 2-D mask, explicit
positions, greedy, dynamic cache: what a user batching the model runs) and ours
(`mipruner.models.common.embeds_rows.engine_rows`, the plain path). Reported: both medians, their ratio (ours /
generate: <= 1 is faster), the answers' agreement, and memory: on CUDA each one's peak allocated memory;
off CUDA the largest tensor any op returns (the quadratic term a packed (S, S) mask used to add).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

PROMPTS = ["What is in the image?", "What colour is the square?", "Is there a cat?", "How many objects are there?"]


def _largest(fn) -> tuple[object, int]:
    """fn()'s result and the numel of the largest tensor an aten op returned while it ran."""
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


def main(argv=None) -> int:
    from PIL import Image

    from mipruner.models.common.embeds_rows import batch_inputs, engine_rows
    from mipruner.models.common.generation import GenerationConfig
    from mipruner.models.common.path import PLAIN
    from mipruner.models.llava.random_weights import build_random_llava

    ap = argparse.ArgumentParser(prog="python -m mipruner.bench rows", description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="float32 / bfloat16 (default: bf16 on CUDA, else float32)")
    ap.add_argument("--vision-layers", type=int, default=1)
    ap.add_argument("--vision-width", type=int, default=64)
    ap.add_argument("--llm-layers", type=int, default=2)
    ap.add_argument("--llm-width", type=int, default=128)
    ap.add_argument("--llm-ffn", type=int, default=256)
    a = ap.parse_args(argv)
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.bfloat16 if a.device.startswith("cuda") else torch.float32)
    ad, desc = build_random_llava(vision_layers=a.vision_layers, vision_width=a.vision_width, llm_layers=a.llm_layers,
                                  llm_width=a.llm_width, llm_ffn=a.llm_ffn, dtype=dtype, device=a.device)
    gen = torch.Generator().manual_seed(0)
    images = [Image.fromarray(torch.randint(0, 256, (336, 336, 3), generator=gen, dtype=torch.uint8).numpy())
              for _ in range(a.batch)]
    with torch.no_grad():
        rows = [(ad.encode(im, PROMPTS[i % len(PROMPTS)]), None) for i, im in enumerate(images)]
    cuda = ad.device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(ad.device)

    @torch.no_grad()
    def run_generate():
        b = batch_inputs(ad, rows)
        out = ad.model.generate(inputs_embeds=b["inputs_embeds"], attention_mask=b["attention_mask"],
                                position_ids=b["position_ids"], max_new_tokens=a.new_tokens, do_sample=False,
                                min_new_tokens=a.new_tokens, pad_token_id=ad.tokenizer.pad_token_id)
        return out.tolist()

    def run_ours():
        config = GenerationConfig(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens)
        return [x.token_ids for x in engine_rows(ad, rows, config, None, PLAIN)]

    runs = {"generate": run_generate, "ours": run_ours}
    times: dict = {k: [] for k in runs}
    peak: dict = {}
    answers: dict = {}
    for k, fn in runs.items():  # warm-up, answers, memory
        if cuda:
            torch.cuda.reset_peak_memory_stats(ad.device)
            answers[k] = fn()
            sync()
            peak[k] = torch.cuda.max_memory_allocated(ad.device)
        else:
            answers[k], peak[k] = _largest(fn)
    for r in range(a.repeats):
        for k in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            sync()
            t0 = time.perf_counter()
            runs[k]()
            sync()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    same = sum(x == y for x, y in zip(answers["ours"], answers["generate"]))
    total = sum(r[0].prompt_tokens for r in rows)
    what = "peak allocated" if cuda else "largest tensor"
    print(f"{desc}; batch {a.batch} unpruned rows ({total} prompt tokens), {a.new_tokens} new tokens, "
          f"{a.repeats} interleaved repeats, {ad.device}")
    for k in runs:
        print(f"  {k:<9} median {med[k] * 1e3:9.1f} ms   {what} {peak[k] / 2**20:9.2f} MiB")
    print(f"  ours / generate: time {med['ours'] / med['generate']:.2f}x, {what} {peak['ours'] / peak['generate']:.2f}x; "
          f"answers equal {same}/{a.batch}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
