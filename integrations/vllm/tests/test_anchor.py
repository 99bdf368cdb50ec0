"""The anchor tests: mipruner's pruning inside vLLM equals unmodified vLLM at K = N, and equals
mipruner's own transformers path on the same kept tokens at K < N (kept indices and greedy tokens).

One in-process engine per family (conftest.engine); unmodified vLLM runs once per family in a
process of its own with every plug-in off (stock_vllm.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mipruner
from mipruner import register_pruner, Selection
from mipruner_vllm import select as worker
from images import FPS, frames, image, video
from conftest import LIMITS
from mipruner.media import Video

QUESTION = "what is in the image ?"
TOKENS = 8
# (width, height, seed): a square image (16 tokens in LLaVA-1.5 and the Qwen families) and, for Qwen, a tall one
# (4 x 6).
IMAGES = {"llava": [(56, 56, 0), (90, 40, 1)], "qwen2_5_vl": [(112, 112, 0), (112, 168, 1)],
          "qwen2_vl": [(112, 112, 0), (112, 168, 1)],
          # LLaVA-NeXT: 4 x 4 base view, then the canvas with row newlines: square, 4 x 8 unpadded to 4 x 4 (36
          # tokens); tall, 8 x 4 (56 tokens)
          "llava_next": [(56, 56, 0), (40, 90, 2)],
          # LLaVA-OneVision (4 x 4 views of 64 px): square (36 tokens), and one whose 14 x 20 unpadded canvas is
          # shrunk to 10 x 14 (anyres_max_9: 166 tokens)
          "llava_onevision": [(64, 64, 0), (300, 200, 3)],
          # Qwen3-VL (32 px per merged token): square 4 x 4 (16 tokens), tall 4 x 6 (24)
          "qwen3_vl": [(128, 128, 0), (128, 192, 1)]}


@register_pruner("vllm_test_first", label="First K (a test plug-in)", score_label=None)
def first_k(visual, text, budget):
    """A method registered the plug-in way, in the test: the first K tokens."""
    n = visual.shape[0]
    return Selection.from_order(torch.arange(budget, device=visual.device), torch.zeros(n, device=visual.device))


# (frames, width, height, seed): Qwen videos of 2 token-frames of 4 x 4 and of 2 token-frames of 4 x 6.
VIDEOS = {"qwen2_5_vl": [(4, 112, 112, 0), (4, 112, 168, 1)], "qwen2_vl": [(4, 112, 112, 0), (4, 112, 168, 1)],
          # OneVision: 4 distinct frames (no temporal patch: equal frames would tie EVS's and VidCom2's scores), each
          # pooled to 2 x 2, then one newline: 17 tokens. Equal frame counts: vLLM 0.32 fails a batch of videos
          # of different counts (docs/vllm.md)
          "llava_onevision": [(4, 64, 64, 0, 1), (4, 64, 64, 1, 1)]}


def prompt_of(adapter, kind: str = "image") -> str:
    msgs = [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": QUESTION}]}]
    return adapter.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)


def sampling():
    """Greedy, exactly TOKENS tokens, EOS masked before that (min_tokens), as the reference's min_new_tokens does:
    with ignore_eos alone, vLLM can still pick EOS, which transformers' min_new_tokens rules out."""
    from vllm import SamplingParams

    return SamplingParams(temperature=0, max_tokens=TOKENS, min_tokens=TOKENS, ignore_eos=True)


def run(llm, adapter, img, kwargs_list):
    """vLLM's outputs for one image under each mm_processor_kwargs, submitted as one batch."""
    reqs = [{"prompt": prompt_of(adapter), "multi_modal_data": {"image": image(*img)}, "mm_processor_kwargs": kw}
            for kw in kwargs_list]
    worker.RECORD.clear()
    return llm.generate(reqs, sampling(), use_tqdm=False)


def run_video(llm, adapter, vid, kwargs_list):
    """vLLM's outputs for one video under each mm_processor_kwargs, submitted as one batch."""
    reqs = [{"prompt": prompt_of(adapter, "video"), "multi_modal_data": {"video": video(*vid)},
             "mm_processor_kwargs": kw} for kw in kwargs_list]
    worker.RECORD.clear()
    return llm.generate(reqs, sampling(), use_tqdm=False)


def media_of(medium):
    """mipruner's input for an image (width, height, seed) or a video (frames, width, height, seed)."""
    if len(medium) == 3:
        return image(*medium)
    fs = frames(*medium)
    return Video(fs, list(range(len(fs))), FPS, len(fs))


def reference(fam, adapter, img, method=None, budget=None, **params):
    """(kept indices or None, greedy tokens) of mipruner's transformers path on the same medium and question."""
    enc = mipruner.encode_for(adapter, media_of(img), QUESTION, [method] if method else [])
    sel = None if method is None else mipruner.select(adapter, enc, method, budget, **params)
    pos = {"positions": "compact"} if fam.startswith("llava") else {}  # 1-D RoPE: vLLM's consecutive positions
    ans = mipruner.answer(adapter, enc, sel, max_new_tokens=TOKENS, min_new_tokens=TOKENS, **pos)
    return (None if sel is None else sel.keep.tolist()), list(ans.token_ids)


def test_keep_all_equals_unmodified_vllm(engine, tmp_path):
    fam, llm, adapter, path = engine
    kinds = [{}, {"mipruner_method": "random", "mipruner_budget": 1.0}, {"mipruner_method": "mi", "mipruner_budget": 1.0,
                                                                          "mipruner_query": QUESTION}]
    ours = {img: [list(o.outputs[0].token_ids) for o in run(llm, adapter, img, kinds)] for img in IMAGES[fam]}
    vids = VIDEOS.get(fam, [])
    ours.update({vid: [list(o.outputs[0].token_ids) for o in run_video(llm, adapter, vid, kinds + [
        {"mipruner_method": "evs", "mipruner_budget": 1.0}, {"mipruner_method": "vidcom2", "mipruner_budget": 1.0}])]
        for vid in vids})
    spec = {"model": str(path), "max_tokens": TOKENS, "limits": LIMITS[fam],
            "requests": [{"prompt": prompt_of(adapter), "image": list(img)} for img in IMAGES[fam]]
            + [{"prompt": prompt_of(adapter, "video"), "video": list(vid)} for vid in vids]}
    (tmp_path / "req.json").write_text(json.dumps(spec))
    subprocess.run([sys.executable, str(Path(__file__).with_name("stock_vllm.py")), str(tmp_path / "req.json"),
                    str(tmp_path / "out.json")], check=True, timeout=600)
    stock = json.loads((tmp_path / "out.json").read_text())
    for img, want in zip(IMAGES[fam] + vids, stock):
        assert ours[img] == [want] * len(ours[img]), (fam, img)
        assert reference(fam, adapter, img)[1] == want, (fam, img)  # and transformers' unpruned answer


CASES = [  # (method, budget, params): one batch per image, every request its own method and budget
    ("mi", 8, {"lam": 0.5}), ("mi", 4, {}), ("similarity", 6, {}), ("divprune", 5, {}), ("random", 7, {"seed": 3}),
    ("cdpruner", 4, {"theta": 0.5}), ("pool", 4, {}), ("vllm_test_first", 3, {}),
]
# LLaVA-NeXT also: the per-frame option (its row newlines are in no frame: kept last) and pool over both views
EXTRA_CASES = {"llava_next": [("divprune", 6, {"per_frame": "even"}), ("pool", 9, {})]}


def test_pruned_equals_transformers_path(engine):
    fam, llm, adapter, _ = engine
    cases = CASES + EXTRA_CASES.get(fam, [])
    for img in IMAGES[fam]:
        kwargs = [{"mipruner_method": m, "mipruner_budget": k, "mipruner_query": QUESTION,
                   **{f"mipruner_{p}": v for p, v in params.items()}} for m, k, params in cases]
        full = run(llm, adapter, img, [{}])[0]
        outs = run(llm, adapter, img, kwargs)  # all in one batch: each must get its own selection
        records = list(worker.RECORD)
        n = adapter_tokens = None
        for (method, k, params), out in zip(cases, outs):
            keep, tokens = reference(fam, adapter, img, method, k, **params)
            n = len(full.prompt_token_ids) - len(out.prompt_token_ids) + k
            adapter_tokens = adapter_tokens or n
            assert n == adapter_tokens, (fam, img, method)  # prompt shorter by exactly N - K
            mine = [r for r in records if r["method"] == method and len(r["keep"]) == k]
            assert len(mine) == 1, (fam, img, method, [(r["method"], len(r["keep"])) for r in records])
            assert mine[0]["keep"].tolist() == keep, (fam, img, method)
            assert list(out.outputs[0].token_ids) == tokens, (fam, img, method, k)
            if method == "vllm_test_first":
                assert keep == list(range(k))


VIDEO_CASES = [  # (method, budget, params) on a video: whole-video, time-aware and per-frame fixed counts
    ("evs", 12, {}), ("vidcom2", 10, {}), ("random", 9, {"seed": 1}),
    ("divprune", 8, {"per_frame": "even"}), ("mi", 11, {}), ("pool", 8, {"per_frame": "even"}),
]
# OneVision also: EVS at a rate (its count from the grid: 4 frames of 2 x 2 and the newline, front end and worker)
EXTRA_VIDEO_CASES = {"llava_onevision": [("evs", 1.0, {"video_pruning_rate": 0.4})]}


def test_video_pruned_equals_transformers_path(engine):
    fam, llm, adapter, _ = engine
    if fam not in VIDEOS:
        pytest.skip(f"{fam}: no video input in this family")
    cases = VIDEO_CASES + EXTRA_VIDEO_CASES.get(fam, [])
    wrong = []  # greedy-token mismatches, all reported at once (kept indices and lengths assert at once)
    for vid in VIDEOS[fam]:
        kwargs = [{"mipruner_method": m, "mipruner_budget": k, "mipruner_query": QUESTION,
                   **{f"mipruner_{p}": v for p, v in params.items()}} for m, k, params in cases]
        full = run_video(llm, adapter, vid, [{}])[0]
        outs = run_video(llm, adapter, vid, kwargs)
        records = list(worker.RECORD)
        for (method, k, params), out in zip(cases, outs):
            keep, tokens = reference(fam, adapter, vid, method, k, **params)
            n = records[0]["n"]
            assert len(full.prompt_token_ids) - len(out.prompt_token_ids) == n - len(keep), (vid, method)
            mine = [r for r in records if r["method"] == method and r["keep"].tolist() == keep]
            assert len(mine) == 1, (vid, method, keep, [(r["method"], r["keep"].tolist()) for r in records])
            if list(out.outputs[0].token_ids) != tokens:
                wrong.append((vid, method, k, list(out.outputs[0].token_ids), tokens))
    assert not wrong, wrong


@pytest.mark.parametrize("params", [{}, {"video_pruning_rate": 0.4}])
def test_video_evs_19_equals_transformers_path(engine, params):
    """EVS keeping frame 0 whole and 3 tokens of frame 1 (budget 19, or a rate of 0.4, on the Qwen families' square
    video of 32 tokens). Once a strict xfail (vLLM's tokens left mipruner.answer's at token 7): vLLM's greedy pick
    there was EOS, which `ignore_eos` leaves in the logits and transformers' `min_new_tokens` masks; `sampling()`
    masks it too now (docs/vllm.md)."""
    fam, llm, adapter, _ = engine
    if fam not in ("qwen2_vl", "qwen2_5_vl"):
        pytest.skip(f"{fam}: the EVS-19 case is one of the Qwen families' square video (32 tokens)")
    vid, budget = VIDEOS[fam][0], (1.0 if params else 19)
    out = run_video(llm, adapter, vid, [{"mipruner_method": "evs", "mipruner_budget": budget,
                                         **{f"mipruner_{p}": v for p, v in params.items()}}])[0]
    keep, tokens = reference(fam, adapter, vid, "evs", budget, **params)
    assert worker.RECORD[-1]["keep"].tolist() == keep and len(keep) == 19
    assert list(out.outputs[0].token_ids) == tokens


BAD = [  # (mm_processor_kwargs, words the ValueError must contain)
    ({"mipruner_method": "mii", "mipruner_budget": 4}, "did you mean 'mi'"),
    ({"mipruner_method": "fastv", "mipruner_budget": 4}, "inside the language model"),
    ({"mipruner_method": "visionzip", "mipruner_budget": 4}, "attention"),
    ({"mipruner_method": "mi_adaptive", "mipruner_budget": 4, "mipruner_query": QUESTION}, "fixed count"),
    ({"mipruner_method": "evs", "mipruner_budget": 4}, "video"),
    ({"mipruner_method": "random", "mipruner_budget": 99}, "mipruner_budget"),
    ({"mipruner_method": "random", "mipruner_budget": 0}, "budget"),
    ({"mipruner_method": "random", "mipruner_budget": "8"}, "mipruner_budget"),
    ({"mipruner_method": "random"}, "mipruner_budget is missing"),
    ({"mipruner_budget": 4}, "without mipruner_method"),
    ({"mipruner_method": "mi", "mipruner_budget": 4}, "mipruner_query"),
    ({"mipruner_method": "mi", "mipruner_budget": 4, "mipruner_query": QUESTION, "mipruner_lam": 7}, "lam"),
    ({"mipruner_method": "random", "mipruner_budget": 4, "mipruner_nope": 1}, "nope"),
]


def test_bad_request_is_a_value_error_and_the_engine_serves_on(engine):
    fam, llm, adapter, _ = engine
    img = IMAGES[fam][0]
    before = run(llm, adapter, img, [{"mipruner_method": "similarity", "mipruner_budget": 4,
                                      "mipruner_query": QUESTION}])[0]
    for kw, words in BAD:
        with pytest.raises(ValueError) as err:
            run(llm, adapter, img, [kw])
        assert words.lower() in str(err.value).lower(), (kw, str(err.value))
    after = run(llm, adapter, img, [{"mipruner_method": "similarity", "mipruner_budget": 4,
                                     "mipruner_query": QUESTION}])[0]
    assert list(after.outputs[0].token_ids) == list(before.outputs[0].token_ids)
    assert len(after.prompt_token_ids) == len(before.prompt_token_ids)


def test_engine_defaults_prune_every_request(models):
    """Fields given to the engine (`LLM(mm_processor_kwargs=...)`, lmms-eval's model_args) prune every request
    that gives none of its own; a request's own fields replace them whole."""
    import gc

    from vllm import LLM

    from conftest import ENGINE, FAMILIES

    path, adapter = models["qwen2_5_vl"]
    llm = LLM(model=str(path), hf_overrides={"architectures": [FAMILIES["qwen2_5_vl"][1]]},
              limit_mm_per_prompt=LIMITS["qwen2_5_vl"],
              mm_processor_kwargs={"mipruner_method": "random", "mipruner_budget": 5, "mipruner_seed": 2}, **ENGINE)
    img = IMAGES["qwen2_5_vl"][0]
    default, own = run(llm, adapter, img, [{}, {"mipruner_method": "divprune", "mipruner_budget": 7}])
    records = {r["method"]: r["keep"].tolist() for r in worker.RECORD}
    for method, k, out, params in [("random", 5, default, {"seed": 2}), ("divprune", 7, own, {})]:
        keep, tokens = reference("qwen2_5_vl", adapter, img, method, k, **params)
        assert records[method] == keep, method
        assert list(out.outputs[0].token_ids) == tokens, method
    assert len(own.prompt_token_ids) - len(default.prompt_token_ids) == 2
    del llm
    gc.collect()


def test_qwen2_vl_video_pruning_rate_changes_nothing(models):
    """vLLM has no EVS of its own for Qwen2-VL, so `--video-pruning-rate` changes nothing there (as on the stock
    model): an unpruned video keeps all its tokens and transformers' answer, and `mipruner_method` on a video is
    not refused (on Qwen2.5-VL it is: that engine's videos go through vLLM's EVS)."""
    import gc

    from vllm import LLM

    from conftest import ENGINE, FAMILIES

    path, adapter = models["qwen2_vl"]
    llm = LLM(model=str(path), hf_overrides={"architectures": [FAMILIES["qwen2_vl"][1]]},
              limit_mm_per_prompt=LIMITS["qwen2_vl"], video_pruning_rate=0.5, **ENGINE)
    vid = VIDEOS["qwen2_vl"][0]
    full, pruned = run_video(llm, adapter, vid, [{}, {"mipruner_method": "evs", "mipruner_budget": 12}])
    assert list(full.outputs[0].token_ids) == reference("qwen2_vl", adapter, vid)[1]
    keep, tokens = reference("qwen2_vl", adapter, vid, "evs", 12)
    assert worker.RECORD[-1]["keep"].tolist() == keep
    assert len(full.prompt_token_ids) - len(pruned.prompt_token_ids) == 32 - 12
    assert list(pruned.outputs[0].token_ids) == tokens
    del llm
    gc.collect()


def test_qwen3_vl_video_is_refused(engine):
    """Qwen3-VL videos are not covered yet (frames interleaved with timestamp text, docs/vllm.md): the plug-in's
    architecture declares images only, so vLLM refuses a video request (its VLLMValidationError, "At most 0
    video(s) may be provided in one prompt") and serves on."""
    fam, llm, adapter, _ = engine
    if fam != "qwen3_vl":
        pytest.skip(f"{fam}: the Qwen3-VL video refusal")
    img = IMAGES[fam][0]
    before = run(llm, adapter, img, [{"mipruner_method": "divprune", "mipruner_budget": 5}])[0]
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError) as err:
        run_video(llm, adapter, (4, 128, 128, 0), [{}])
    assert "0 video(s)" in str(err.value), str(err.value)
    after = run(llm, adapter, img, [{"mipruner_method": "divprune", "mipruner_budget": 5}])[0]
    assert list(after.outputs[0].token_ids) == list(before.outputs[0].token_ids)
