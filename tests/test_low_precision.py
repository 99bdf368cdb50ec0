"""bf16 and fp16 on the CPU: the proxies for a GPU run, which loads its models in bfloat16.

CI runs float32 elsewhere; the dtype rules of low precision differ (bf16 Cholesky, half `topk` /
`argsort`, bf16 x fp32 matmuls, `index_add` dtypes, additive masks in bf16), so here:
  (a) every registered method's selection contract in torch.bfloat16 and torch.float16: through
      `mipruner.prune` on synthetic inputs of that dtype (attention and keys included; the dense
      and the chunked paths; `mipruner.testing.low_precision_failures`), and through
      `mipruner.select` on tiny models cast to it (`mipruner.testing.select_failures`);
  (b) the keep-all anchor of every family of tester_models.FAMILIES with the model cast to the
      dtype: keeping every visual token gives exactly (torch.equal) the unpruned model's logits
      and greedy tokens at that dtype, for an image and, where the family takes one, a video;
  (c) the in-LLM methods (FastV, DART, SparseVLM) select and answer at that dtype: their keep-all
      answer is the unpruned answer, a 25% selection answers; the app's batch (the keep-all row and
      pruned rows of different lengths) answers on the plain and the GPU decoding path (bucketed
      lengths + static cache), the keep-all row's first token being the unpruned one.
Every op these paths use has a CPU kernel for both dtypes in the torch we pin (none is skipped).
"""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner import inllm
from mipruner.serve.batch import answer_batch, use_decode_path
from mipruner.media import write_video
from mipruner.pruners import get_pruner, list_pruners
from mipruner.pruners import mi as mi_mod
from mipruner.testing import low_precision_failures, select_failures

from .conftest import TEST_DEVICE
from .models import tester_models
from .models.tiny_llava import scene
from .no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)

DTYPES = [torch.bfloat16, torch.float16]
DT_IDS = ["bf16", "fp16"]
PRE = [n for n in list_pruners() if get_pruner(n).stage != "llm"]
IN_LLM = [n for n in list_pruners() if get_pruner(n).stage == "llm"]
VIDEO = {"llava", "video_llava", "llava_onevision", "qwen2_vl", "qwen2_5_vl", "qwen3_vl"}  # LLaVA-NeXT: images only
PROMPT = "What colour is the square?"
NEW = 4


# ------------------------------------------------------------------------------ (a) mipruner.prune
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", PRE)
@pytest.mark.parametrize("path", ["dense", "chunked"])
def test_prune_contract_in_low_precision(name, dtype, path, monkeypatch):
    if path == "chunked":  # MI, DivPrune, CDPruner: the per-step column path, never the whole Gram matrix
        monkeypatch.setattr(mi_mod, "DENSE_LIMIT", 8)
        monkeypatch.setattr(mi_mod, "_CHUNK", 16)
    # K = 20 > d = 16: CDPruner's kernel runs out of rank, its fallback runs too
    assert low_precision_failures(name, dtype, TEST_DEVICE, n=40, budgets=(1, 20, 40)) == []


def test_low_precision_check_catches_a_half_only_break():
    """The check fails a method whose selection is broken only in half precision."""
    from mipruner.pruners import Selection, register_pruner, unregister_pruner

    @register_pruner("half_break_test", label="Half break (test)")
    def half_break(visual, text, budget) -> Selection:
        """Keeps the first `budget` tokens; its scores are NaN for half inputs."""
        n = visual.shape[0]
        scores = torch.linspace(1, 0, n, device=visual.device)
        if visual.dtype != torch.float32:
            scores = scores * float("nan")
        return Selection.from_order(torch.arange(budget, device=visual.device), scores)

    try:
        assert low_precision_failures("half_break_test", torch.float32) == []
        got = low_precision_failures("half_break_test", torch.bfloat16)
        assert got and all("not all finite" in f for f in got)
    finally:
        unregister_pruner("half_break_test")


# ------------------------------------------------------------------------------ models at a dtype
@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("low_precision"))
    return {fam: tester_models.build(fam, root) for fam in tester_models.FAMILIES}


@pytest.fixture(scope="module")
def video_path(tmp_path_factory):
    frames = [scene(80, 60, square=(4 * i, 10, 4 * i + 14, 24), seed=i) for i in range(8)]
    return write_video(frames, str(tmp_path_factory.mktemp("vid") / "clip.mp4"))


@pytest.fixture(scope="module")
def models(paths, video_path):
    """(family, dtype) -> adapter loaded in that dtype; (family, dtype, media) -> its encoding (lazily)."""
    held: dict = {}

    def get(fam, dtype, media=None):
        if (fam, dtype) not in held:
            held[fam, dtype] = mipruner.load(paths[fam], device=TEST_DEVICE, dtype=dtype)
        ad = held[fam, dtype]
        if media is None:
            return ad
        if (fam, dtype, media) not in held:
            m = video_path if media == "video" else scene(112, 56, square=(70, 14, 84, 28))
            held[fam, dtype, media] = ad.encode(m, PROMPT, need_attention=True)
        return ad, held[fam, dtype, media]
    return get


def plain_inputs(fam: str, enc) -> dict:
    """The unpruned model's own inputs for `enc` (what the family tests compare with)."""
    st = enc.state
    if fam.startswith("qwen"):
        return dict(input_ids=st.input_ids, mm_token_type_ids=st.mm_token_type_ids, **st.vision_inputs,
                    **st.rope_kwargs)
    return st.ref


# ------------------------------------------------------------------------------ (a) mipruner.select
SELECT_FAMILIES = ["llava", "qwen2_vl"]  # a [CLS] tower and a merged one without [CLS]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("fam", SELECT_FAMILIES)
@pytest.mark.parametrize("name", list_pruners())
def test_select_contract_in_low_precision(models, fam, dtype, name):
    ad, enc = models(fam, dtype, "video" if get_pruner(name).video else "image")  # a video method reads a clip
    assert enc.visual.dtype == dtype
    assert select_failures(name, ad, enc) == []
    sel = mipruner.select(ad, enc, name, 5)
    assert bool(torch.isfinite(sel.scores).all())


# ------------------------------------------------------------------------------ (b) keep-all anchor
CASES = [(f, m) for f in tester_models.FAMILIES for m in (("image", "video") if f in VIDEO else ("image",))]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("fam,media", CASES, ids=[f"{f}-{m}" for f, m in CASES])
def test_keep_all_is_the_unpruned_model_in_low_precision(models, fam, media, dtype):
    ad, enc = models(fam, dtype, media)
    assert ad.model.dtype == dtype and enc.visual.dtype == dtype
    inputs = plain_inputs(fam, enc)
    out = ad.model(**inputs).logits[0]
    assert out.dtype == dtype
    ref = out.float()
    assert bool(torch.isfinite(ref).all())
    assert torch.equal(ad.prefill_logits(enc), ref)
    assert torch.equal(ad.prefill_logits(enc, keep=torch.arange(enc.n_visual)), ref)
    n_in = inputs["input_ids"].shape[1]
    plain = ad.model.generate(**inputs, do_sample=False, max_new_tokens=NEW)[0, n_in:].tolist()
    assert ad.generate(enc, keep=torch.arange(enc.n_visual), max_new_tokens=NEW).token_ids == plain
    for layer in (1, 2):  # the in-LLM layer loop (SDPA masks at this dtype) with nothing dropped
        assert torch.equal(inllm.prefill_logits(ad, enc, None, layer=layer), ref)


# ------------------------------------------------------------------------------ (c) answers
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("fam,media", CASES, ids=[f"{f}-{m}" for f, m in CASES])
def test_in_llm_methods_answer_in_low_precision(models, fam, media, dtype):
    ad, enc = models(fam, dtype, media)
    unpruned = ad.generate(enc, max_new_tokens=NEW).token_ids
    for name in IN_LLM:
        if get_pruner(name).video and media != "video":  # DyCoke: a video method (an image gets NotApplicable)
            continue
        cache: dict = {}
        sel = mipruner.select(ad, enc, name, 0.25, cache=cache)
        assert bool(torch.isfinite(sel.scores).all()), name
        ans = mipruner.answer(ad, enc, sel, max_new_tokens=NEW, cache=cache)
        merged = int(sel.extras.get("n_merged", 0))  # SparseVLM's recycled tokens go in too
        assert 1 <= len(ans.token_ids) <= NEW and sel.budget <= ans.visual_tokens <= sel.budget + merged, name
        everything = mipruner.select(ad, enc, name, enc.n_visual, cache=cache)
        assert mipruner.answer(ad, enc, everything, max_new_tokens=NEW, cache=cache).token_ids == unpruned, name


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("fam", tester_models.FAMILIES)
def test_batched_answers_and_the_gpu_path_in_low_precision(models, fam, dtype):
    """The app's batch (keep-all row + pruned rows of different lengths, left-padded) on the plain
    path and on the GPU path (bucket 16, static cache), at the dtype: every row answers, the
    keep-all row is the unpruned answer on both paths (its greedy tokens; rounding ties aside, a
    padded batch is not bit-identical, so only the first token is compared across rows)."""
    ad, enc = models(fam, dtype, "image")
    unpruned = ad.generate(enc, max_new_tokens=NEW).token_ids
    sels = [None] + [mipruner.select(ad, enc, m, b) for m, b in (("mi", 0.25), ("random", 3), ("similarity", 0.5))]
    try:
        for path in (dict(), dict(bucket=16, static_cache=True)):
            use_decode_path(ad, **path)
            got = answer_batch(ad, enc, sels, max_new_tokens=NEW)
            assert [a.visual_tokens for a in got] == [enc.n_visual] + [s.budget for s in sels[1:]]
            assert all(1 <= len(a.token_ids) <= NEW for a in got)
            assert got[0].token_ids[0] == unpruned[0], path
    finally:
        ad.use_decode_path()
