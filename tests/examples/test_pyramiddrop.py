"""PyramidDrop, the example in-LLM plug-in (examples/pyramiddrop) and the package's built-in `pdrop` (the
same rule, `mipruner.inllm.pyramiddrop`), on tiny checkpoints with 4 decoder
layers (stages at 1, 2, 3: the release's 8 / 16 / 24 of 32, scaled):

  release      on LLaVA-1.5 with the released ratios (0.5, 0.25, 0.125 of N_V): each stage's kept
               tokens, the last prompt row's prefill logits (1e-5) and the greedy tokens equal a
               restatement of the released forward (tests/examples/pdrop_reference.py), which
               renumbers positions after each drop and shifts them while decoding;
  keep-all     budget N_V is the unpruned model, logits bit for bit and the greedy answer, for every
               family that runs in-LLM methods (image and video);
  answers      a pruned answer is the same one by one, through answer_batch and with or without the
               select cache; K chosen per stage as the schedule says.
"""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner import inllm

from ..inllm.test_inllm import CASES, _id, adapters, encoded, no_grad  # noqa: F401
from ..inllm.test_sparsevlm import paths  # noqa: F401  (4 decoder layers, every family)
from .pdrop_reference import reference_pdrop


def test_the_builtin_pdrop_is_the_example(pyramiddrop, adapters, encoded):
    from mipruner.inllm import pyramiddrop as builtin

    assert builtin.schedule is not pyramiddrop.schedule  # the package's own copy of the rule
    for fam, media in (("qwen2_vl", "image"), ("llava", "image")):
        ad, enc = adapters[fam], encoded[fam, media]
        for k in (1, enc.n_visual // 3):
            a, b = (mipruner.select(ad, enc, n, k) for n in ("pyramiddrop", "pdrop"))
            assert torch.equal(a.keep, b.keep) and torch.equal(a.extras["survived"], b.extras["survived"])


@pytest.mark.parametrize("sched_of", ["example", "builtin"])
def test_schedule(pyramiddrop, sched_of):
    from mipruner.inllm import pyramiddrop as builtin

    sched = pyramiddrop.schedule if sched_of == "example" else builtin.schedule
    assert sched(72, 576, 32, 0.5) == ((8, 16, 24), (288, 144, 72))  # the released setting
    assert sched(2, 16, 4, 0.5) == ((1, 2, 3), (8, 4, 2))
    assert sched(16, 16, 4, 0.5) == ((1, 2, 3), (16, 16, 16))  # keep-all: every stage keeps all
    assert sched(6, 16, 4, 0.5) == ((1, 2, 3), (8, 6, 6))  # never below the budget
    assert sched(3, 16, 2, 0.5) == ((1,), (3,))  # shallow: the last stage only


@pytest.mark.parametrize("name", ["pyramiddrop", "pdrop"])
def test_equals_the_released_forward(pyramiddrop, adapters, encoded, name):
    ad, enc = adapters["llava"], encoded["llava", "image"]
    n = enc.n_visual
    k = int(n * 0.125)
    cache: dict = {}
    sel = mipruner.select(ad, enc, name, k, cache=cache)
    assert sel.extras["layers"].tolist() == [1, 2, 3] and sel.budget == k
    vis = enc.state.visual_positions.cpu()
    assert torch.equal(vis, torch.arange(int(vis[0]), int(vis[0]) + n))  # one contiguous image span
    lm = ad.model.model.language_model
    embeds = ad.pruned_inputs(enc, None)["inputs_embeds"]
    logits, tokens, kept = reference_pdrop(lm, ad.model.lm_head, embeds, int(vis[0]), n, [1, 2, 3],
                                           [0.5, 0.25, 0.125], max_new_tokens=6)
    survived = sel.extras["survived"]
    for s, ref in enumerate(kept):
        assert torch.nonzero(survived > s).flatten().tolist() == ref.tolist(), s
    assert sel.keep.tolist() == kept[-1].tolist()
    ours = inllm.staged_prefill_logits(ad, enc, sel)
    assert ours.shape[0] == embeds.shape[1] - n + k
    torch.testing.assert_close(ours[-1], logits, atol=1e-5, rtol=1e-5)
    ans = mipruner.answer(ad, enc, sel, max_new_tokens=6, cache=cache)
    assert ans.token_ids == tokens[:len(ans.token_ids)] and ans.visual_tokens == k
    # the run is pruned (the test could fail): not the unpruned logits
    assert not torch.allclose(ours[-1], ad.prefill_logits(enc)[-1], atol=1e-4)


@pytest.mark.parametrize("name", ["pyramiddrop", "pdrop"])
@pytest.mark.parametrize("fam,media", CASES, ids=[_id(c) for c in CASES])
def test_keep_all_is_the_unpruned_model(pyramiddrop, adapters, encoded, fam, media, name):
    ad, enc = adapters[fam], encoded[fam, media]
    ref, ans = ad.prefill_logits(enc), ad.generate(enc, max_new_tokens=5)
    cache: dict = {}
    sel = mipruner.select(ad, enc, name, enc.n_visual, cache=cache)
    assert sel.keep.tolist() == list(range(enc.n_visual)) and sel.extras["layers"].tolist() == [1, 2, 3]
    assert torch.equal(inllm.staged_prefill_logits(ad, enc, sel), ref)
    for c in (cache, None):
        got = mipruner.answer(ad, enc, sel, max_new_tokens=5, cache=c)
        assert got.token_ids == ans.token_ids and got.visual_tokens == enc.n_visual


@pytest.mark.parametrize("fam,media", [("llava_next", "image"), ("qwen2_vl", "image"), ("qwen3_vl", "video")],
                         ids=_id)
def test_pruned_answers_one_by_one_and_batched(pyramiddrop, adapters, encoded, fam, media):
    ad, enc = adapters[fam], encoded[fam, media]
    k = max(1, enc.n_visual // 8)
    cache: dict = {}
    sel = mipruner.select(ad, enc, "pyramiddrop", k, cache=cache)
    assert sel.budget == k and (sel.extras["counts"].diff() <= 0).all()
    one = mipruner.answer(ad, enc, sel, max_new_tokens=5, cache=cache)
    replay = mipruner.answer(ad, enc, sel, max_new_tokens=5)
    ref, batched = mipruner.answer_batch(ad, enc, [None, sel], max_new_tokens=5, cache=cache)
    assert one.token_ids == replay.token_ids == batched.token_ids
    assert one.visual_tokens == k and one.input_tokens == int(enc.state.input_ids.shape[-1]) - enc.n_visual + k
