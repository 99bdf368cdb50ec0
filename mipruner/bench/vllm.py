"""`python -m mipruner.bench vllm`: time to first token and requests per second through vLLM, with and
without mipruner's pruning (the `mipruner-vllm` plug-in, docs/vllm.md), interleaved in one run.

Needs vLLM 0.32.0 and the plug-in installed (integrations/vllm; on the CPU the venv of `bash .ci/vllm`).
The model is random-weight LLaVA-1.5 at its real token count (336 px: 576 visual tokens) with small
widths (`mipruner_vllm.tiny`), built offline into a temp folder. Each round runs every configuration
once, in turn, on one in-process engine:
- TTFT: one request, 1 new token, wall time of `LLM.generate`;
- req/s: `--batch` requests with `--max-tokens` new tokens each, submitted together.
"unpruned" is vLLM's own path (no mipruner fields: the plug-in returns vLLM's embeddings untouched).
The floor is each configuration's prompt-length share of the unpruned prompt: what prefill compute
could fall to if it scaled with tokens. vLLM's EVS prunes video only (Qwen), so it is not in this
image benchmark. Medians with 95% intervals (`stats.median_ci`). On a CPU the figures are a proxy.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import tempfile
import time

from .stats import median_ci

QUESTION = "what is in the image ?"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m mipruner.bench vllm", description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default="mi,random", help="pruning methods, comma-separated (default mi,random)")
    p.add_argument("--budgets", default="64", help="tokens kept per image, comma-separated (default 64)")
    p.add_argument("--image-size", type=int, default=336, help="tower input side in px (336: 576 tokens)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--batch", type=int, default=8, help="requests submitted together for req/s (default 8)")
    p.add_argument("--max-tokens", type=int, default=8, help="new tokens per request for req/s (default 8)")
    return p.parse_args(argv)


def configs(args) -> list[tuple[str, dict]]:
    out = [("unpruned", {})]
    for m in args.methods.split(","):
        for k in args.budgets.split(","):
            out.append((f"{m}@{k}", {"mipruner_method": m, "mipruner_budget": int(k), "mipruner_query": QUESTION}))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        from vllm import LLM, SamplingParams

        import mipruner_vllm
        from mipruner_vllm import tiny
    except ImportError as e:
        print(f"bench vllm needs vLLM 0.32.0 and the mipruner-vllm plug-in installed (docs/vllm.md): {e}")
        return 2
    if mipruner_vllm.version_problem():
        print(mipruner_vllm.version_problem())
        return 2
    import numpy as np
    from PIL import Image

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    folder = tempfile.mkdtemp(prefix="mipruner-bench-vllm-")
    path, adapter = tiny.build_llava(pathlib.Path(folder), image_size=args.image_size)
    llm = LLM(model=str(path), hf_overrides={"architectures": ["MiPrunerLlavaForConditionalGeneration"]},
              dtype="float32", enforce_eager=True, max_model_len=2048, distributed_executor_backend="uni", seed=0,
              limit_mm_per_prompt={"image": 1, "video": 0}, enable_prefix_caching=False)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    prompt = adapter.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    rng = np.random.default_rng(0)

    def request(kw):  # a new image each time: no cache serves a repeat
        img = Image.fromarray(rng.integers(0, 256, (args.image_size, args.image_size, 3), dtype=np.uint8))
        return {"prompt": prompt, "multi_modal_data": {"image": img}, "mm_processor_kwargs": kw}

    first = SamplingParams(temperature=0, max_tokens=1)
    many = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    cfgs = configs(args)
    ttft = {name: [] for name, _ in cfgs}
    rps = {name: [] for name, _ in cfgs}
    length = {}
    for name, kw in cfgs:  # warm-up, and each prompt's length
        length[name] = len(llm.generate([request(kw)], first, use_tqdm=False)[0].prompt_token_ids)
    for _ in range(args.rounds):
        for name, kw in cfgs:
            reqs = [request(kw)]
            t = time.perf_counter()
            llm.generate(reqs, first, use_tqdm=False)
            ttft[name].append(time.perf_counter() - t)
            reqs = [request(kw) for _ in range(args.batch)]
            t = time.perf_counter()
            llm.generate(reqs, many, use_tqdm=False)
            rps[name].append(args.batch / (time.perf_counter() - t))
    base_t, base_r = median_ci(ttft["unpruned"])["median"], median_ci(rps["unpruned"])["median"]
    print(f"vLLM {mipruner_vllm.installed_vllm()}, random-weight LLaVA-1.5 at {args.image_size} px, float32, "
          f"{args.rounds} interleaved rounds, batch {args.batch} x {args.max_tokens} tokens for req/s")
    print(f"{'config':<14} {'prompt':>6} {'floor':>6} {'TTFT ms (95% CI)':>24} {'x':>6} {'req/s (95% CI)':>22} {'x':>6}")
    for name, _ in cfgs:
        t, r = median_ci(ttft[name]), median_ci(rps[name])
        t_ci = f"[{t['low'] * 1e3:.0f}, {t['high'] * 1e3:.0f}]" if t["low"] is not None else ""
        r_ci = f"[{r['low']:.2f}, {r['high']:.2f}]" if r["low"] is not None else ""
        print(f"{name:<14} {length[name]:>6} {length[name] / length['unpruned']:>6.2f} "
              f"{t['median'] * 1e3:>9.0f} {t_ci:>14} {t['median'] / base_t:>6.2f} "
              f"{r['median']:>8.2f} {r_ci:>13} {r['median'] / base_r:>6.2f}")
    return 0
