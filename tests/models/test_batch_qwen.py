"""Batched answers on Qwen2-VL, Qwen2.5-VL and Qwen3-VL (tiny checkpoints), image and video: several
selections of one encoding decode as one left-padded batch (M-RoPE positions gathered per row,
each row decoding from its own unpruned max position + 1, Qwen3-VL's deepstack rows per row) and
give the one-by-one answers (tie rule in batch_check.py) with the same first logits; the keep-all
row is the unpruned answer; rows of different encodings and modalities batch together; the GPU
path (bucketed lengths + static KV cache, no compile here) keeps the keep-all anchor."""
from __future__ import annotations

import pytest
import torch

import mipruner
import mipruner.models
from mipruner.serve.batch import answer_batch, answer_items, use_decode_path

from ..no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)
from . import tiny_qwen
from .anchor import reference_inputs as plain_inputs
from .batch_check import Scores, check_logits, compare, compare_all, one_by_one
from .test_qwen_family import scene, video

FAMILIES = [f for f, fam in mipruner.models.FAMILIES.items() if fam.folder == "qwen"]
PROMPT = "What is red in the image?"
NEW = 6
BUCKET = 16  # the GPU path's length bucket in these tests
CASES = [(k, m) for k in FAMILIES for m in ("image", "video")]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch_qwen")
    return {kind: mipruner.load(tiny_qwen.build(kind, str(root))) for kind in FAMILIES}


@pytest.fixture(scope="module")
def encoded(adapters):
    out = {}
    for kind, ad in adapters.items():
        out[kind, "image"] = ad.encode(scene(), PROMPT, need_attention=True)
        out[kind, "video"] = ad.encode(video(), PROMPT, need_attention=True)
    return out


def selections(adapter, enc):
    n = enc.n_visual
    g = torch.Generator().manual_seed(5)
    sels = [None, mipruner.select(adapter, enc, "mi", max(1, n // 4), lam=0.5),
            mipruner.select(adapter, enc, "similarity", max(1, n // 2)),
            mipruner.select(adapter, enc, "visionzip", max(2, n // 3))]  # merged tokens (no [CLS] in Qwen)
    sels += [torch.randperm(n, generator=g)[:k] for k in (1, n - 1)]
    return sels


@pytest.mark.parametrize("kind,media", CASES)
def test_batch_equals_one_by_one(adapters, encoded, kind, media):
    a, e = adapters[kind], encoded[kind, media]
    sels = selections(a, e)
    ref = one_by_one(a, e, sels, NEW)
    scores = Scores()
    got = answer_batch(a, e, sels, max_new_tokens=NEW, logits_processor=[scores])
    assert len({r.input_tokens for r, _ in ref}) >= 4
    check_logits(scores, ref)
    done, total = compare_all(got, ref)
    assert done >= 0.75 * total, (done, total)
    # keep-all row = the unpruned answer = transformers' generate on the processor inputs
    g = a.model.generate(**plain_inputs(e), do_sample=False, max_new_tokens=NEW)
    plain = g[0, e.state.input_ids.shape[1]:].tolist()
    assert ref[0][0].token_ids == plain
    compare(got[0].token_ids, plain, ref[0][1].margins)


def test_rows_stop_at_their_own_eos(adapters, encoded):
    a, e = adapters["qwen2_vl"], encoded["qwen2_vl", "image"]
    sels = selections(a, e)
    eos = a.generate(e, max_new_tokens=NEW, eos_token_id=[]).token_ids[1]
    ref = one_by_one(a, e, sels, NEW, eos_token_id=eos)
    got = answer_batch(a, e, sels, max_new_tokens=NEW, eos_token_id=eos)
    assert len(ref[0][0].token_ids) <= 2 and got[0].token_ids[-1] == eos
    assert max(len(r.token_ids) for r, _ in ref) > 2
    compare_all(got, ref)


@pytest.mark.parametrize("kind", FAMILIES)
def test_rows_of_different_encodings_and_modalities(adapters, encoded, kind):
    """Image and video rows in one batch: both modalities' encoder outputs (Qwen3-VL: the joint
    deepstack rows), different unpruned lengths, so different decoding starts per row."""
    a = adapters[kind]
    ei, ev = encoded[kind, "image"], encoded[kind, "video"]
    assert a.next_position(ei) != a.next_position(ev)
    rows = [(ev, mipruner.select(a, ev, "mi", 7, lam=1.0)), (ei, None), (ev, None), (ei, torch.arange(2))]
    ref = [one_by_one(a, e, [s], NEW)[0] for e, s in rows]
    scores = Scores()
    got = answer_items(a, rows, max_new_tokens=NEW, logits_processor=[scores])
    check_logits(scores, ref)
    done, total = compare_all(got, ref)
    assert done >= 0.75 * total


def test_in_llm_selections_answer_one_by_one(adapters, encoded):
    a, e = adapters["qwen2_5_vl"], encoded["qwen2_5_vl", "image"]
    cache: dict = {}
    dart = mipruner.select(a, e, "dart", 4, cache=cache, layer=1)
    got = answer_batch(a, e, [dart, None], max_new_tokens=NEW, cache=cache)
    alone = mipruner.answer(a, e, dart, max_new_tokens=NEW, cache=cache)
    assert got[0].token_ids == alone.token_ids and got[0].input_tokens == alone.input_tokens


@pytest.mark.parametrize("kind,media", [("qwen2_vl", "image"), ("qwen2_5_vl", "video"), ("qwen3_vl", "video")])
def test_gpu_path_keeps_the_keep_all_anchor(adapters, encoded, kind, media):
    a, e = adapters[kind], encoded[kind, media]
    plain_ref = one_by_one(a, e, [None], NEW)[0]
    full = a.prefill_logits(e)[-1]
    lm = a.text_decoder()
    calls, sizes = [], []

    def hook(module, args, kwargs):
        cache = kwargs.get("past_key_values")
        calls.append((int(kwargs["inputs_embeds"].shape[1]), type(cache).__name__))
        sizes.append(cache.get_max_length() if cache is not None else None)

    use_decode_path(a, bucket=BUCKET, static_cache=True)
    handle = lm.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        fast = one_by_one(a, e, [None], NEW)[0]
        L = e.state.input_ids.shape[1]
        assert calls[0][0] == -(-L // BUCKET) * BUCKET and L % BUCKET  # the prefill, padded
        assert {c[1] for c in calls[1:]} == {"StaticCache"}  # the steps decode in a static cache
        full_size = sizes[1]
        compare(fast[0].token_ids, plain_ref[0].token_ids, plain_ref[1].margins)
        torch.testing.assert_close(fast[1].first, full, atol=1e-5, rtol=0)
        # the smallest and the largest kept count of the first bucket: one prefill shape, shorter than
        # keep-all's, and one static-cache size for both, smaller than keep-all's (sized to the pruned bucket)
        base = L - e.n_visual
        top = -(-(base + 1) // BUCKET) * BUCKET
        widths, pruned = [], set()
        for k in (1, top - base):
            calls.clear()
            sizes.clear()
            a.generate(e, keep=torch.arange(k), max_new_tokens=NEW, eos_token_id=[])
            widths.append(calls[0][0])
            pruned.update(sizes[1:])
        assert 1 < top - base < e.n_visual and widths == [top, top] and top < -(-L // BUCKET) * BUCKET
        assert len(pruned) == 1
        size = pruned.pop()
        assert size % BUCKET == 0 and size < full_size
    finally:
        handle.remove()
        a.use_decode_path()
