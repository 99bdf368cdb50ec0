"""`python -m mipruner.bench space-cost`: what a visitor waits for on a CPU Space, and each suggested model's size.

Default: the CPU Space's default model (`components.hosting.space_default.HOSTED_DEFAULT["cpu"]`,
LLaVA-OneVision-qwen2-0.5b) with random weights at its real shape, full depth (SigLIP-so400m 26 layers,
Qwen2-0.5B 24 layers, 152,000 vocabulary rows; `mipruner.models.onevision.random_weights.build(shape="0.5B")`), in fp32 as the app
runs on a CPU, through the engine the app's handlers call (`mipruner.engine.Engine`, as
`components.core.logic.AppLogic` does):
  startup   importing torch, transformers, gradio and mipruner, building the model and its engine; on a
            Space the weights are read from disk instead of drawn (and downloaded once before), and the
            page is built (`components.page.ui.build_demo`, about a second, not included);
  encode    one 640 x 480 photo and a question: the vision tower once (with its attention, as the app
            asks), the prompt embedded (`Engine.encode`);
  unpruned  the unpruned answer (`Engine.generate`, greedy, `--new-tokens`, the app's 32);
  mi_10     MI-Pruner at 10% of the visual tokens: its selection, then its answer;
  view_6    one view of six methods at 10% (`Engine.view`: each selection and its panel drawn): the
            app's four defaults (MI, Random, Similarity, Attention), DivPrune and FastV (in the LLM).
Each is timed once (a visitor's first request: cold caches), in seconds; peak resident memory by
`resource.getrusage`. Answers of random weights mean nothing; their token counts are printed.
--tiny: the same steps on the tiny OneVision (seconds, for tests).

`--params`: the parameters of every suggested model, counted as the GPU check counts them (the model
built from its config on the meta device: no memory, no weights; `sum(p.numel())`, tied weights once),
with the weights' bytes in bf16 and fp32 and whether they fit each kind of Space hardware (`HARDWARE_GB`:
"yes" within 85% of its memory, "tight" within it, "no"; on a CPU fp32, the app's default there, else bf16),
as a Markdown table. No timing.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

PROMPT = "what is in the image? describe the red square."
SIX = ("mi", "random", "similarity", "attention", "divprune", "fastv")


# -- parameters of the suggested models ----------------------------------------------------------

def _zoo(family: str):
    def build(device, dtype):
        from .zoo import get_family

        return get_family(family).build(tiny=False, device=device, dtype=dtype, seed=0)[0].model
    return build


def _shape(module: str, shape: str):
    def build(device, dtype):
        import importlib

        return importlib.import_module(f"mipruner.models.{module}").build(
            tiny=False, device=device, dtype=dtype, shape=shape)[0].model
    return build


def _llava_next_mistral(device, dtype):
    """llava-hf/llava-v1.6-mistral-7b-hf: LLaVA-NeXT's CLIP ViT-L/14-336 (LlavaNextConfig's defaults) with
    Mistral-7B-Instruct-v0.2 (MistralConfig's defaults: 32 layers of width 4096, FFN 14336, 8 KV heads) and
    its 32,064 vocabulary rows (the checkpoint's config.json)."""
    import torch
    import transformers as tf

    config = tf.LlavaNextConfig(text_config=tf.MistralConfig(vocab_size=32064, rope_theta=1e6,
                                                             max_position_embeddings=32768))
    with torch.device(device):
        return tf.LlavaNextForConditionalGeneration(config).to(dtype)


# hub id -> its shape built from configs (the family folders' random_weights builders restate each checkpoint's published config)
SHAPES = {
    "llava-hf/llava-1.5-7b-hf": _zoo("llava"),
    "llava-hf/llava-v1.6-mistral-7b-hf": _llava_next_mistral,
    "LanguageBind/Video-LLaVA-7B-hf": _zoo("video_llava"),
    "llava-hf/llava-onevision-qwen2-0.5b-ov-hf": _shape("onevision.random_weights", "0.5B"),
    "llava-hf/llava-onevision-qwen2-7b-ov-hf": _zoo("llava_onevision"),
    "OpenGVLab/InternVL3-1B-hf": _shape("internvl.random_weights", "1B"),
    "OpenGVLab/InternVL3-8B-hf": _zoo("internvl"),
    "Qwen/Qwen2-VL-2B-Instruct": _zoo("qwen2_vl"),
    "Qwen/Qwen2.5-VL-3B-Instruct": _zoo("qwen2_5_vl"),
    "Qwen/Qwen3-VL-2B-Instruct": _zoo("qwen3_vl"),
}


def count_params(model_id: str) -> int:
    """Parameters of `model_id`'s shape built on the meta device (tied weights counted once)."""
    import torch

    model = SHAPES[model_id]("meta", torch.bfloat16)
    return sum(p.numel() for p in model.parameters())


# Space hardware -> its memory in GB (CPU: RAM; GPU: the GPU's), from the hub's Space hardware documentation
HARDWARE_GB = {"CPU basic": 16, "T4": 16, "L4 / A10G": 24, "ZeroGPU": 70}
ROOM = 0.85  # weights above this share of the memory leave too little for activations, caches and the server


def fits(weights_gb: float, memory_gb: float) -> str:
    """"yes" (weights within ROOM of the memory), "tight" (within it), "no"."""
    return "yes" if weights_gb <= ROOM * memory_gb else "tight" if weights_gb <= memory_gb else "no"


def cpu_fit(bf16_gb: float, fp32_gb: float, memory_gb: float) -> str:
    """On a CPU the app loads fp32 unless MIPRUNER_DTYPE=bf16."""
    if fp32_gb <= ROOM * memory_gb:
        return "yes (fp32)"
    return {"yes": "bf16", "tight": "bf16, tight", "no": "no"}[fits(bf16_gb, memory_gb)]


def params_table(ids=None) -> list[dict]:
    rows = []
    for mid in ids or SHAPES:
        n = count_params(mid)
        bf16, fp32 = 2 * n / 1e9, 4 * n / 1e9
        row = {"model": mid, "params_b": round(n / 1e9, 2), "bf16_gb": round(bf16, 1), "fp32_gb": round(fp32, 1)}
        for hw, gb in HARDWARE_GB.items():
            row[hw] = cpu_fit(bf16, fp32, gb) if hw.startswith("CPU") else fits(bf16, gb)
        rows.append(row)
    return rows


# -- the CPU Space's costs ---------------------------------------------------------------------

def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux


def _say(line: str) -> None:
    print(line, flush=True)


def measure(*, tiny: bool, new_tokens: int = 32, threads: int | None = None, log=_say, save=None) -> dict:
    """The steps of the module docstring, timed once each; returns the figures (seconds).
    save(figures): called after each step (a run stopped by a time limit keeps what it measured)."""
    t0 = time.perf_counter()
    import gradio  # noqa: F401  (the app's start-up imports it: its time counts)
    import torch

    import mipruner
    from mipruner.engine import Engine

    from mipruner.models.onevision.random_weights import build
    from .zoo import picture

    if threads:
        torch.set_num_threads(threads)
    out: dict = {"tiny": tiny, "threads": torch.get_num_threads(), "dtype": "float32", "new_tokens": new_tokens}

    def done(line: str) -> None:
        out["peak_rss_gb"] = round(_rss_gb(), 2)
        log(line)
        if save:
            save(out)

    out["imports_s"] = time.perf_counter() - t0

    t = time.perf_counter()
    adapter, desc = build(tiny=tiny, device="cpu", dtype=torch.float32, shape="0.5B")
    engine = Engine(adapter, name="random-llava-onevision-0.5b")
    out["model"], out["params_b"] = desc, round(sum(p.numel() for p in adapter.model.parameters()) / 1e9, 3)
    out["model_s"] = time.perf_counter() - t
    out["startup_s"] = time.perf_counter() - t0
    done(f"{desc}: {out['params_b']} B parameters, built in {out['model_s']:.1f} s")

    session = engine.new_session()
    with tempfile.TemporaryDirectory() as tmp:  # the app hands the engine an uploaded file's path
        photo = os.path.join(tmp, "photo.png")
        picture(640, 480).save(photo)
        t = time.perf_counter()
        key = engine.encode(session, photo, PROMPT, need_attention=True)  # as AppLogic.encode
        out["encode_s"] = time.perf_counter() - t
    enc = engine.encoded(session, key)
    out["n_visual"] = int(enc.n_visual)
    done(f"encode: {out['encode_s']:.1f} s, {enc.n_visual} visual tokens")

    t = time.perf_counter()
    ans = engine.generate(session, key, None, max_new_tokens=new_tokens)  # as the page's reference answer
    out["unpruned_s"], out["unpruned_tokens"] = time.perf_counter() - t, len(ans.token_ids)
    out["input_tokens"] = ans.input_tokens
    done(f"unpruned answer: {out['unpruned_s']:.1f} s ({len(ans.token_ids)} new tokens, {ans.input_tokens} input)")

    t = time.perf_counter()
    sel = mipruner.select(adapter, enc, "mi", 0.1)
    out["mi_10_select_s"] = time.perf_counter() - t
    ans = mipruner.answer(adapter, enc, sel, max_new_tokens=new_tokens)
    out["mi_10_s"], out["mi_10_tokens"] = time.perf_counter() - t, len(ans.token_ids)
    out["mi_10_kept"] = int(sel.keep.numel())
    done(f"MI at 10% ({out['mi_10_kept']} tokens): {out['mi_10_s']:.1f} s (selection {out['mi_10_select_s']:.2f} s)")

    t = time.perf_counter()
    views = engine.view(session, key, list(SIX), 0.1)  # as AppLogic.view: each selection and its panel drawn
    out["view_6_s"] = time.perf_counter() - t
    out["view_6_methods"] = {v.method: round(v.prune_ms + v.render_ms) for v in views}
    done(f"one view of {len(views)} methods: {out['view_6_s']:.1f} s ({out['view_6_methods']} ms)")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mipruner.bench space-cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--params", action="store_true", help="only the parameter table of the suggested models")
    p.add_argument("--tiny", action="store_true", help="the tiny OneVision (for tests), not the real shape")
    p.add_argument("--new-tokens", type=int, default=32, help="answer length (the app's default, 32)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--json", default=None, help="write the figures here")
    a = p.parse_args(argv)
    if a.params:
        rows = params_table()
        hws = " | ".join(f"{hw} ({gb} GB)" for hw, gb in HARDWARE_GB.items())
        print(f"| model | parameters (B) | bf16 weights (GB) | fp32 weights (GB) | {hws} |")
        print("|" + "---|" * (4 + len(HARDWARE_GB)))
        for r in rows:
            print(f"| `{r['model']}` | {r['params_b']:.2f} | {r['bf16_gb']:.1f} | {r['fp32_gb']:.1f} | "
                  + " | ".join(r[hw] for hw in HARDWARE_GB) + " |")
        result: object = rows
    else:
        result = measure(tiny=a.tiny, new_tokens=a.new_tokens, threads=a.threads,
                         save=(lambda got: _write(a.json, got)) if a.json else None)
        keys = ("startup_s", "encode_s", "unpruned_s", "mi_10_s", "view_6_s")
        print("| " + " | ".join(keys) + " | peak RSS (GB) |\n|" + "---|" * (len(keys) + 1))
        print("| " + " | ".join(f"{result[k]:.1f}" for k in keys) + f" | {result['peak_rss_gb']:.1f} |")
    if a.json:
        _write(a.json, result)
    return 0


def _write(path: str, figures) -> None:
    with open(path, "w") as f:
        json.dump(figures, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
