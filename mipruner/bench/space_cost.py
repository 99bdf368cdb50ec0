"""`python -m mipruner.bench space-cost`: what a visitor waits for on a CPU Space, and each suggested model's size.

Default: the CPU Space's default model (`components.hosting.space_default.HOSTED_DEFAULT["cpu"]`,
LLaVA-OneVision-qwen2-0.5b) with random weights at its real shape, full depth (SigLIP-so400m 26 layers,
Qwen2-0.5B 24 layers, 152,000 vocabulary rows; `mipruner.models.onevision.random_weights.build(shape="0.5B")`), in fp32 as the app
runs on a CPU, through the engine the app's handlers call (`mipruner.serve.service.ModelService`, as
`components.core.logic.AppLogic` does):
  startup   a fresh interpreter importing what the app imports at start (gradio where installed, torch,
            transformers, mipruner: a child process, so this library never imports gradio itself), then
            building the model and its engine; on a Space the weights are read from disk instead of
            drawn (and downloaded once before), and the page is built (`components.page.ui.build_demo`,
            about a second, not included);
  encode    one 640 x 480 photo and a question: the vision tower once (with its attention, as the app
            asks), the prompt embedded (`ModelService.encode`);
  unpruned  the unpruned answer (`ModelService.generate`, greedy, `--new-tokens`, the app's 32);
  mi_10     MI-Pruner at 10% of the visual tokens: its selection, then its answer;
  view_6    one view of six methods at 10% (`ModelService.view`: each selection and its panel drawn): the
            app's four defaults (MI, Random, Similarity, Attention), DivPrune and FastV (in the LLM).
Each round takes a new session (nothing cached), encodes, then runs the unpruned answer, MI at 10% and
the view in an order rotated each round (each step comes first as often). The first round is reported
as `cold` (a visitor's first request); after `--warmup` untimed rounds (1), `--repeats` timed rounds (3)
give each step's median (and a 95% interval from 6 runs). MI's ratio to the unpruned answer is printed
with its floor (the same ratio of their FLOPs). Seconds; peak resident memory by `resource.getrusage`.
Answers of random weights mean nothing; their token counts are printed.
--tiny: the same steps on the tiny OneVision (seconds, for tests).
--fewer-views: each round also encodes the photo as its base view only (`views="base"`, the app's default on
a CPU: 1 view instead of the anyres 5) in its own new session, the two encodes in an order rotated each round
(`encode_base`), and draws the six methods' view on it (`view_6_base`): a visitor's first panels are the
encode plus the view (`first_panels` = encode + view_6, `first_panels_base` = encode_base + view_6_base).

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

STEPS = ("unpruned", "mi_10", "view_6")  # the steps on one encoding, run in a rotated order each round
APP_IMPORTS = ("gradio", "torch", "transformers", "mipruner")  # what app.py imports at start


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux


def _say(line: str) -> None:
    print(line, flush=True)


def app_imports_s() -> tuple[float, list[str]]:
    """Seconds a fresh interpreter takes to import what the app imports at start (`APP_IMPORTS`, those
    installed), and the modules imported. A child process: this library never imports the app's UI library."""
    import importlib.util
    import subprocess

    names = [m for m in APP_IMPORTS if importlib.util.find_spec(m) is not None]
    code = "import time; t = time.perf_counter(); import " + ", ".join(names) + "; print(time.perf_counter() - t)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(r.stdout.strip().splitlines()[-1]), names


def rotated(names, r: int) -> list:
    """`names` starting at the r-th: over len(names) rounds each comes first, last and between once."""
    names = list(names)
    k = r % len(names)
    return names[k:] + names[:k]


def measure(*, tiny: bool, new_tokens: int = 32, threads: int | None = None, warmup: int = 1, repeats: int = 3,
            log=_say, save=None, fewer_views: bool = False) -> dict:
    """The steps of the module docstring; returns the figures (seconds). Each round takes a new session (no
    cached encoding, selection or answer) and encodes the photo, then runs `STEPS` on that encoding in an
    order rotated each round. Round 1 is a visitor's first request (`cold`); `warmup` rounds are untimed,
    then `repeats` rounds give each step's median and interval (`stats.median_ci`; with fewer than 6
    runs, the median alone and the runs). save(figures): called after each round (a run stopped by a
    time limit keeps what it measured)."""
    if warmup < 1 or repeats < 1:
        raise ValueError("warmup and repeats must be >= 1 (the first round is the cold one)")
    import torch

    import mipruner
    from mipruner.serve.service import ModelService

    from mipruner.models.onevision.random_weights import build
    from .floors import cell_floor, device_figures, floor_ratio
    from .stats import median_ci
    from .zoo import picture

    if threads:
        torch.set_num_threads(threads)
    out: dict = {"tiny": tiny, "threads": torch.get_num_threads(), "dtype": "float32", "new_tokens": new_tokens,
                 "warmup": warmup, "repeats": repeats, "steps": ["encode", *STEPS]}

    def done(line: str) -> None:
        out["peak_rss_gb"] = round(_rss_gb(), 2)
        log(line)
        if save:
            save(out)

    out["imports_s"], out["imported"] = app_imports_s()
    t = time.perf_counter()
    adapter, desc = build(tiny=tiny, device="cpu", dtype=torch.float32, shape="0.5B")
    engine = ModelService(adapter, name="random-llava-onevision-0.5b")
    out["model"], out["params_b"] = desc, round(sum(p.numel() for p in adapter.model.parameters()) / 1e9, 3)
    out["model_s"] = time.perf_counter() - t
    out["startup_s"] = out["imports_s"] + out["model_s"]
    done(f"{desc}: {out['params_b']} B parameters, built in {out['model_s']:.1f} s; a fresh interpreter imports "
         f"{', '.join(out['imported'])} in {out['imports_s']:.1f} s")

    def step(name, session, key, enc, got):
        t = time.perf_counter()
        if name == "unpruned":  # as the page's reference answer
            ans = engine.generate(session, key, None, max_new_tokens=new_tokens)
            got.update(unpruned_tokens=len(ans.token_ids), input_tokens=ans.input_tokens)
        elif name == "mi_10":
            sel = mipruner.select(adapter, enc, "mi", 0.1)
            got["mi_10_select_s"] = time.perf_counter() - t
            ans = mipruner.answer(adapter, enc, sel, max_new_tokens=new_tokens)
            got.update(mi_10_tokens=len(ans.token_ids), mi_10_kept=int(sel.keep.numel()),
                       mi_10_input_tokens=ans.input_tokens)
        else:  # as AppLogic.view: each selection and its panel drawn
            views = engine.view(session, key, list(SIX), 0.1)
            got["view_6_methods"] = {v.method: round(v.prune_ms + v.render_ms) for v in views}
        return time.perf_counter() - t

    base_keys = ("encode_base", "view_6_base", "first_panels", "first_panels_base") if fewer_views else ()
    runs: dict = {k: [] for k in ("encode", *STEPS, "mi_10_select", *base_keys)}
    with tempfile.TemporaryDirectory() as tmp:  # the app hands the engine an uploaded file's path
        photo = os.path.join(tmp, "photo.png")
        picture(640, 480).save(photo)
        for r in range(warmup + repeats):
            session, got = engine.new_session(), {}
            for views in rotated(["all", "base"] if fewer_views else ["all"], r):
                s_v = session if views == "all" else engine.new_session()
                t = time.perf_counter()
                k_v = engine.encode(s_v, photo, PROMPT, need_attention=True, views=views)  # as AppLogic.encode
                got["encode" if views == "all" else "encode_base"] = time.perf_counter() - t
                if views == "all":
                    key = k_v
                else:
                    base_session, base_key = s_v, k_v
            enc = engine.encoded(session, key)
            order = rotated(STEPS, r)
            for name in order:
                got[name] = step(name, session, key, enc, got)
            got["mi_10_select"] = got.pop("mi_10_select_s")
            if fewer_views:
                t = time.perf_counter()
                engine.view(base_session, base_key, list(SIX), 0.1)
                got["view_6_base"] = time.perf_counter() - t
                got["first_panels"] = got["encode"] + got["view_6"]
                got["first_panels_base"] = got["encode_base"] + got["view_6_base"]
                if r == 0:
                    out["n_visual_base"] = int(engine.encoded(base_session, base_key).n_visual)
            if r == 0:
                out["cold"] = {k: got[k] for k in runs}
                out["n_visual"] = int(enc.n_visual)
                out.update({k: got[k] for k in ("unpruned_tokens", "input_tokens", "mi_10_tokens", "mi_10_kept",
                                                "mi_10_input_tokens", "view_6_methods")})
                dev = device_figures("cpu", "fp32")  # no figures: the floor of the ratio is its FLOPs'
                out["mi_10_floor"] = floor_ratio(
                    cell_floor(adapter.config, dev, "fp32", got["mi_10_input_tokens"], new_tokens, images=0),
                    cell_floor(adapter.config, dev, "fp32", got["input_tokens"], new_tokens, images=0), "total")[0]
            if r >= warmup:
                for k in runs:
                    runs[k].append(got[k])
                out["runs"] = runs
                out.update({f"{k}_s": median_ci(v) for k, v in runs.items()})
            done(f"round {r + 1}/{warmup + repeats} ({'warm-up' if r < warmup else 'timed'}; "
                 f"{' -> '.join(order)}): " + ", ".join(f"{k} {got[k]:.2f} s" for k in runs))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mipruner.bench space-cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--params", action="store_true", help="only the parameter table of the suggested models")
    p.add_argument("--tiny", action="store_true", help="the tiny OneVision (for tests), not the real shape")
    p.add_argument("--new-tokens", type=int, default=32, help="answer length (the app's default, 32)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds; the first is reported as `cold`")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds, each step's order rotated per round")
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--fewer-views", action="store_true",
                   help="also encode the photo as its base view only (the app's CPU default) and view it")
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
        result = measure(tiny=a.tiny, new_tokens=a.new_tokens, threads=a.threads, warmup=a.warmup,
                         repeats=a.repeats, save=(lambda got: _write(a.json, got)) if a.json else None,
                         fewer_views=a.fewer_views)
        print(format_table(result))
    if a.json:
        _write(a.json, result)
    return 0


def format_table(result: dict) -> str:
    """The steps as a Markdown table: the cold (first) run, the timed runs' median [interval] and the ratio of
    MI at 10% to the unpruned answer (medians) beside its floor (`floors.floor_ratio` in FLOPs)."""
    from .latency_report import ci

    keys = ("encode", *STEPS, *(k for k in ("encode_base", "view_6_base", "first_panels", "first_panels_base")
                                 if f"{k}_s" in result))
    lines = [f"start-up {result['startup_s']:.1f} s (imports {result['imports_s']:.1f} s + model "
             f"{result['model_s']:.1f} s), peak RSS {result['peak_rss_gb']:.1f} GB; {result['repeats']} timed "
             f"rounds after {result['warmup']} warm-up (the first is the cold one)",
             "| | " + " | ".join(f"{k} (s)" for k in keys) + " |", "|" + "---|" * (len(keys) + 1),
             "| cold (first request) | " + " | ".join(f"{result['cold'][k]:.2f}" for k in keys) + " |",
             "| median [95% interval] | " + " | ".join(ci(result[f"{k}_s"], 2) for k in keys) + " |"]
    if result.get("n_visual_base") is not None:
        lines.append(f"visual tokens: every view {result['n_visual']}, the base view only {result['n_visual_base']}; "
                     f"encode_base / encode: {result['encode_base_s']['median'] / result['encode_s']['median']:.3f}")
    if result.get("mi_10_floor") is not None:
        lines.append(f"MI at 10% / unpruned answer: {result['mi_10_s']['median'] / result['unpruned_s']['median']:.3f} "
                     f"[floor {result['mi_10_floor']:.3f} (FLOPs)]")
    return "\n".join(lines)


def _write(path: str, figures) -> None:
    with open(path, "w") as f:
        json.dump(figures, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
