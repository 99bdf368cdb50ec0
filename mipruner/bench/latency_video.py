"""`bench latency --video-frames 8,16,32 --video-family qwen2_5_vl|llava_onevision`: the video methods' cost
against the prefill they save, and EVS's time to first token against the unpruned answer and `generate`.

The model is the family's random-weight model (`mipruner.bench.video.build`: real widths; `--llm-layers N` N
decoder layers, the CPU proxy; `--tiny` for tests), the input `video.media(F)` for each F of `--video-frames`,
its tokens as `video.layout` gives them (checked against the encoding). Every video method selects K = EVS's
retained tokens at q = 0.75 (`video.retained`), EVS at q = 0.75 itself, so the methods compare at equal tokens.
Two interleaved groups per frame count (`latency.run_phase`: `--warmup` untimed rounds, then `--repeats`
rounds each running every cell of the group once, in turn):
  prefill F   on one cached encoding: `prefill none` and `prefill <method>` (the time to the first token's
              logits of a one-token answer, `adapter.generate`: the LLM's prefill over the unpruned or the
              pruned prompt) and `select <method>` (`mipruner.select`, cold cache). Per method:
                select_vs_saved  = select ms / (prefill none ms - prefill <method> ms)   (goal <= 0.05)
                prefill_ratio    = prefill <method> ms / prefill none ms, beside its floor: the pruned prompt's
                                   prefill FLOPs over the unpruned one's (`mipruner.measure.compute`)
              each a ratio of the cells' medians in this group.
  ttft F      (F in `--ttft-frames`, default the first frame count) end to end from the video:
              `generate` (transformers `model.generate` on the processor's inputs, which are prepared before
              its timer starts: the baseline gets its processor for free), `ours-none` and `ours-evs q=0.75`
              (`mipruner.encode_for` -> `select` -> `answer`, the processor and the tower included), answers
              of `--lengths[0]` tokens. Ratios of the TTFT medians: evs / none and evs / generate, each beside
              its floor: the same ratio of the cells' LLM prefill FLOPs (`floors.cell_floor` with no tower
              pass, `mipruner.measure.compute`'s formula; in ms where the device's figures are known).
  decode F    (the same F, answers of more than one token) DyCoke, whose DP masks visual keys at every decoding
              step: `decode dycoke-keep-all` (budget N_V, the in-LLM loop unpruned) and `decode dycoke` (the
              release's k = p = 0.7), per-token decode time from the answer's own marks; decode_ms_ratio beside
              its floor, the decoding's FLOPs share (`mipruner.measure.compute.decode_compute`). The keys are masked,
              not gathered: SDPA still reads every cached key, so the time falls less than the FLOPs count.
"""
from __future__ import annotations

import torch

import mipruner
from mipruner.measure.compute import selection_compute
from mipruner.models.common.request import ProcessorState

from . import latency_runs as R
from . import video as V
from .floors import cell_floor, floor_ratio
from .stats import ratio_text
from .zoo import PROMPTS


def params(method: str) -> dict:
    return {"video_pruning_rate": V.RATE} if method == "evs" else {}


def label(method: str) -> str:
    return method + "".join(f" vpr={v:g}" for v in params(method).values())


def _cell(kind, method, group, run, budget="all", length=1) -> dict:
    return {"name": f"{kind} {label(method)}", "phase": "eager", "kind": kind, "method": label(method),
            "budget": budget, "length": length, "batch": 1, "group": group, "run": run}


def prefill_run(adapter, clock, enc, keep):
    """The time to the first token's logits of a one-token answer on a cached encoding (the prefill)."""
    force = dict(adapter.fixed_length_kwargs(1))

    def run(_media, _prompt):
        first = R.FirstLogits(clock)
        t0 = clock.mark()
        a = adapter.generate(enc, keep, max_new_tokens=1, logits_processor=[first], **force)
        t1 = clock.mark()
        out = R._result(clock, t0, first.first, t1, 1, a.input_tokens, len(a.token_ids))
        out["total_ms"] = out["ttft_ms"]
        return out

    return run


def select_run(adapter, clock, enc, method: str, k: int):
    def run(_media, _prompt):
        t0 = clock.mark()
        mipruner.select(adapter, enc, method, k, cache={}, strict=False, **params(method))
        t1 = clock.mark()
        clock.sync()
        return {"total_ms": clock.ms(t0, t1)}

    return run


def reference_inputs(enc) -> dict:
    """The model's own inputs of an encoding (transformers' processor output; for Qwen the ids, the vision
    inputs and the M-RoPE arguments the adapter gave `get_rope_index`)."""
    st = enc.state
    if isinstance(st, ProcessorState):
        return dict(st.ref)
    return dict(input_ids=st.input_ids, mm_token_type_ids=st.mm_token_type_ids, **st.vision_inputs,
                **st.rope_kwargs)


def generate_run(adapter, clock, enc, n: int):
    """transformers `model.generate` on the processor's inputs (prepared once, outside the timer)."""
    inputs = {k: v.to(adapter.device) if isinstance(v, torch.Tensor) else v for k, v in reference_inputs(enc).items()}
    if "pixel_values_videos" in inputs:
        inputs["pixel_values_videos"] = inputs["pixel_values_videos"].to(adapter.model.dtype)

    def run(_media, _prompt):
        first = R.FirstLogits(clock)
        t0 = clock.mark()
        out = adapter.model.generate(**inputs, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                     pad_token_id=adapter.tokenizer.pad_token_id, logits_processor=[first])
        t1 = clock.mark()
        n_in = int(inputs["input_ids"].shape[1])
        return R._result(clock, t0, first.first, t1, n, n_in, int(out.shape[1]) - n_in)

    return run


DYCOKE = {"dycoke_k": 0.7, "dycoke_p": 0.7}  # the release's ratios (at the budget N_V: TTM and DP as released)


def decode_run(adapter, clock, enc, n: int, params: dict, log: list):
    """DyCoke's answer of n tokens on a cached encoding (`params` {}: keep-all, the in-LLM loop unpruned),
    its per-token decode time from the answer's own marks; each answer appended to `log`."""
    def run(_media, _prompt):
        t0 = clock.mark()
        cache: dict = {}
        sel = mipruner.select(adapter, enc, "dycoke", enc.n_visual, cache=cache, **params)
        ans = mipruner.answer(adapter, enc, sel, max_new_tokens=n, min_new_tokens=n, cache=cache)
        t1 = clock.mark()
        log.append((sel, ans))
        return {"total_ms": clock.ms(t0, t1), "ttft_ms": None, "prompt_tokens": ans.input_tokens,
                "decode_ms_per_token": 1000 * ans.decode_s / max(1, len(ans.token_ids) - 1),
                "new_tokens": len(ans.token_ids)}

    return run


def decode_cells(adapter, clock, enc, frames: int, n: int) -> tuple[list, dict]:
    """The decode group of DyCoke (its DP masks visual keys per step): keep-all vs the release's ratios."""
    g = f"decode F={frames}"
    logs = {"none": [], "dycoke": []}
    cells = [_cell("decode", "dycoke-keep-all", g, decode_run(adapter, clock, enc, n, {}, logs["none"]), length=n),
             _cell("decode", "dycoke", g, decode_run(adapter, clock, enc, n, DYCOKE, logs["dycoke"]), length=n)]
    return cells, logs


def decode_goals(adapter, enc, cells: list[dict], frames: int, logs: dict) -> dict:
    """DyCoke's per-token decode time over keep-all's, beside its decoding FLOPs share (`decode_compute`)."""
    from mipruner.measure.compute import adapter_shape, decode_compute

    med = {c["method"]: c["decode_ms_per_token"]["median"] for c in cells
           if c.get("frames") == frames and c["kind"] == "decode" and c.get("decode_ms_per_token")}
    out = {}
    if logs["dycoke"]:
        sel, ans = logs["dycoke"][-1]
        dc = decode_compute(adapter_shape(adapter), int(enc.text.shape[0]), enc.n_visual, sel, ans)
        out.update(decode_flops_share=round(dc.flops_share, 4), visual_keys_share=round(dc.visual_keys_share, 4),
                   steps=dc.steps, ttm_kept=int(sel.budget))
    if med.get("dycoke") and med.get("dycoke-keep-all"):
        out["decode_ms_ratio"] = round(med["dycoke"] / med["dycoke-keep-all"], 3)
    return out


def frame_cells(adapter, clock, lay, enc, k: int, methods, ttft: bool, n: int) -> tuple[list, list, dict]:
    """(prefill group cells, ttft group cells, {method: selection}) of one frame count."""
    sels = {m: mipruner.select(adapter, enc, m, k, cache={}, strict=False, **params(m)) for m in methods}
    g = f"prefill F={lay.frames}"
    pre = [_cell("prefill", "none", g, prefill_run(adapter, clock, enc, None))]
    for m in methods:
        pre.append(_cell("prefill", m, g, prefill_run(adapter, clock, enc, sels[m]), k))
        pre.append(_cell("select", m, g, select_run(adapter, clock, enc, m, k), k))
    out = []
    if ttft:
        g = f"ttft F={lay.frames}"
        out = [_cell("latency", "generate", g, generate_run(adapter, clock, enc, n), length=n),
               _cell("latency", "ours-none", g, R.ours(adapter, clock, n, "none", "all", {}), length=n),
               _cell("latency", "evs", g, R.ours(adapter, clock, n, "evs", 1.0, params("evs")), length=n)]
        out[1]["method"] = "ours-none"
        out[2]["method"] = "ours-" + label("evs")
    return pre, out, sels


def video_goals(cells: list[dict], frames: int, methods, compute: dict) -> dict:
    """The ratios of one frame count from the cells' medians (module docstring); `compute`: {method: pruned
    prefill FLOPs / unpruned, from mipruner.measure.compute}."""
    def med(kind, method):
        c = next((c for c in cells if c.get("frames") == frames and c["kind"] == kind and c["method"] == method),
                 None)
        return c["total_ms"]["median"] if c else None

    none = med("prefill", "none")
    out = {}
    for m in methods:
        pruned, sel = med("prefill", label(m)), med("select", label(m))
        saved = none - pruned if none is not None and pruned is not None else None
        out[label(m)] = {"select_ms": sel, "prefill_none_ms": none, "prefill_ms": pruned, "saved_ms": saved,
                         "select_vs_saved": round(sel / saved, 4) if sel is not None and saved and saved > 0 else None,
                         "prefill_ratio": round(pruned / none, 3) if pruned is not None and none else None,
                         "prefill_ratio_floor": compute.get(m), "floor_basis": "FLOPs (mipruner.measure.compute)"}
    return out


def ttft_goals(cells: list[dict], frames: int) -> dict:
    """EVS's time to first token over the unpruned answer's and generate's, each with its floor."""
    lat = {c["method"]: c for c in cells if c.get("frames") == frames and c["kind"] == "latency"}
    evs = lat.get("ours-" + label("evs"))
    out = {}
    for key, other in (("evs_ttft_vs_none", lat.get("ours-none")), ("evs_ttft_vs_generate", lat.get("generate"))):
        if evs and other and evs.get("ttft_ms") and other.get("ttft_ms"):
            out[key] = round(evs["ttft_ms"]["median"] / other["ttft_ms"]["median"], 3)
            out[key + "_text"] = ratio_text(evs["ttft_ms"], other["ttft_ms"])
            out[key + "_floor"] = floor_ratio(evs.get("floor"), other.get("floor"), "ttft")
    return out


def attach_floor(adapter, dev, dtype: str, summary: dict, length: int) -> None:
    """The cell's floor (`floors.cell_floor`, no tower pass: the LLM prefill of its prompt)."""
    if summary.get("prompt_tokens"):
        summary["floor"] = cell_floor(adapter.config, dev, dtype, summary["prompt_tokens"], length, images=0)


def format_video(report: dict) -> str:
    from .latency_report import ci

    lines = [f"\nvideo: {report['video_family']}, methods at K = EVS's retained tokens at q = {V.RATE:g}"]
    for f, v in report["video"].items():
        lay = v["layout"]
        lines.append(f"\nF={f} frames: N_V {lay['n_visual']} ({lay['token_frames']} frames x {lay['per_frame']} "
                     f"+ {lay['outside']}), K {v['k']}")
        for m, g in v["methods"].items():
            fl = g["prefill_ratio_floor"]
            lines.append(f"  {m:<14} select {_ms(g['select_ms'])} ms / saved {_ms(g['saved_ms'])} ms "
                         f"= {_r(g['select_vs_saved'])} (goal <= 0.05); prefill {_ms(g['prefill_ms'])} / "
                         f"{_ms(g['prefill_none_ms'])} ms = {_r(g['prefill_ratio'])} [floor "
                         f"{'-' if fl is None else f'{fl:.3f}'} (FLOPs)]")
        t = v.get("ttft") or {}
        for key in ("evs_ttft_vs_none", "evs_ttft_vs_generate"):
            if key in t:
                r, basis = t[key + "_floor"]
                lines.append(f"  {key}: {t[key + '_text']} [floor {'-' if r is None else f'{r:.3f}'} ({basis})]")
        for c in (c for c in report["cells"] if c.get("frames") == int(f) and c["kind"] == "latency"):
            lines.append(f"    {c['method']:<16} TTFT {ci(c.get('ttft_ms'))} ms, prompt {c.get('prompt_tokens')}")
        d = v.get("decode") or {}
        if "decode_flops_share" in d:
            lines.append(f"  dycoke decode (k=p=0.7, TTM keeps {d['ttm_kept']}): per token "
                         f"{d.get('decode_ms_ratio', '-')} x keep-all's [floor {d['decode_flops_share']:.3f} (decode "
                         f"FLOPs); visual keys read {d['visual_keys_share']:.3f} of unpruned, {d['steps']} steps]")
    return "\n".join(lines)


def _ms(x):
    return "-" if x is None else f"{x:.2f}"


def _r(x):
    return "-" if x is None else f"{x:.4f}"


def run(a, report: dict, dev: dict, clock, save, run_phase, summarize) -> None:
    """The video groups (module docstring) into `report["video"]` and `report["cells"]`."""
    from .cli import DTYPES

    adapter, desc = V.build(a.video_family, tiny=a.tiny, device=a.device, dtype=DTYPES[a.dtype],
                            llm_layers=a.llm_layers, seed=a.seed, vision_layers=a.vision_layers)
    report.update(model=desc, video_family=a.video_family, video={})
    methods = [m for m in V.METHODS if m in mipruner.list_pruners()]
    n = a.lengths[0]
    print(f"model: {desc}; device figures: {dev['source']}")
    for frames in a.video_frames:
        lay = V.layout(adapter, a.video_family, frames, a.tiny, a.video_size)
        media, prompt = V.media(frames, a.tiny, a.video_size), PROMPTS["video"]
        with torch.inference_mode():
            enc = mipruner.encode_for(adapter, media, prompt, methods)
        if enc.n_visual != lay.n_visual:
            raise RuntimeError(f"layout says {lay.n_visual} visual tokens, the encoding has {enc.n_visual}")
        k = V.retained(lay)
        ttft = frames in a.ttft_frames
        with torch.inference_mode():
            pre, lat, sels = frame_cells(adapter, clock, lay, enc, k, methods, ttft, n)
        compute = {m: round(selection_compute(adapter, enc, sels[m]).flops_share, 3)
                   for m in methods}
        entry = {"layout": lay.as_dict(), "k": k, "n_text": int(enc.text.shape[0])}
        for group in (pre, lat):
            if not group:
                continue
            print(f"{group[0]['group']}: {len(group)} cells, {a.warmup} warm-up rounds, {a.repeats} interleaved rounds")
            with torch.inference_mode():
                run_phase(group, [(media, prompt)], a.repeats, a.warmup, clock)
            for c in group:
                s = summarize(c)
                s["frames"] = frames
                if c["kind"] == "latency":
                    attach_floor(adapter, dev, a.dtype, s, n)
                report["cells"].append(s)
        entry["methods"] = video_goals(report["cells"], frames, methods, compute)
        if ttft:
            entry["ttft"] = ttft_goals(report["cells"], frames)
        if ttft and "dycoke" in mipruner.list_pruners() and n > 1:
            dec, logs = decode_cells(adapter, clock, enc, frames, n)
            print(f"decode F={frames}: {len(dec)} cells, {a.warmup} warm-up rounds, {a.repeats} interleaved rounds")
            with torch.inference_mode():
                run_phase(dec, [(media, prompt)], a.repeats, a.warmup, clock)
            for c in dec:
                s = summarize(c)
                s["frames"] = frames
                report["cells"].append(s)
            entry["decode"] = decode_goals(adapter, enc, report["cells"], frames, logs)
        report["video"][str(frames)] = entry
        save()
