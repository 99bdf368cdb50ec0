"""SparseVLM inside the LLM (`mipruner.inllm.sparsevlm`) on tiny checkpoints of every family with 4
decoder layers (3 stages, at layers 1, 2, 3), built offline as in test_inllm (its `adapters` and
`encoded` fixtures, fed by this module's deeper `paths`).

  rules        schedule (released counts and layers), recycle counts, raters, one stage's ranking
               and DPC-kNN, all by hand;
  keep-all     logits torch.equal the adapter's unpruned prefill, greedy tokens equal its generate,
               every family, image and video (with and without the select cache);
  pruned       logits (1e-5) and greedy tokens equal the model's OWN forward on the full prompt with
               each stage's dropped tokens hidden as keys from its layer on and every merged token
               written into its slot at its layer as the mean of its members (tests/inllm/reference.py);
               merged tokens are part of that reference, so recycling is tested in the exact check;
               recycling off is checked too;
  attention    each stage's scores are the raters' head-mean attention of the model's eager
               `output_attentions` at the stage's layer - 1, under the earlier stages' pruning;
  cache        another budget reuses the first stage's layers; answer reuses the selected prefix.
"""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.inllm import sparsevlm as sv

from ..models import tiny_llava, tiny_qwen
from .reference import hide_by_stage, reference_staged
from .test_inllm import (CASES, LLAVA, _eager, _id, no_grad, _reference_inputs, adapters,  # noqa: F401
                         decoder_layer_calls, encoded, tiny_checkpoints)

DEPTH = 4


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """Tiny checkpoints of every family with DEPTH decoder layers (the builders' text configs, deeper)."""
    root = tmp_path_factory.mktemp("sparsevlm")
    llava_text, qwen_text = tiny_llava._text_config, tiny_qwen._text_config

    def deeper_llava(vocab):
        cfg = llava_text(vocab)
        cfg.num_hidden_layers = DEPTH
        return cfg

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiny_llava, "_text_config", deeper_llava)
        mp.setattr(tiny_qwen, "_text_config", lambda tok, **kw: qwen_text(tok, **{"num_hidden_layers": DEPTH, **kw}))
        return tiny_checkpoints(root)


# ------------------------------------------------------------------------------------ rules by hand
def test_schedule():
    for counts in sv.RELEASED_COUNTS.values():  # the released settings at 576 tokens, 32 layers
        assert sv.schedule(counts[2], 576, 32) == ((3, 7, 16), counts)
    assert sv.schedule(17, 576, 28)[0] == (3, 6, 14) and sv.schedule(17, 576, 36)[0] == (3, 8, 18)
    assert sv.schedule(17, 576, 4) == ((1, 2, 3), (66, 30, 17))
    assert sv.schedule(17, 576, 3) == ((1, 2), (30, 17))  # shallow: the last stages
    assert sv.schedule(17, 576, 2) == ((1,), (17,)) and sv.schedule(17, 576, 1) == ((1,), (17,))
    assert sv.schedule(34, 1152, 32)[1] == (132, 60, 34)  # twice the tokens: the released "64" doubled
    for n_v in (16, 196, 576, 2880):
        for k in range(1, n_v + 1, max(1, n_v // 37)):
            layers, (c1, c2, c3) = sv.schedule(k, n_v, 32)
            assert n_v >= c1 >= c2 >= c3 == k and layers == (3, 7, 16)
        assert sv.schedule(n_v, n_v, 32)[1] == (n_v,) * 3


def test_released_names_are_layer_averaged_counts():
    # the release's settings, named by the visual tokens per layer averaged over 32 layers
    for name, counts in sv.RELEASED_COUNTS.items():
        after = sv.planned_tokens(counts, 576, 0.3)
        assert int(sv.equivalent_tokens((3, 7, 16), after, 576, 32)) == name
    assert sv.planned_tokens((66, 30, 17), 576, 0.3) == [82, 32, 18]  # 66 + 16, 30 + 2, 17 + 1
    assert sv.equivalent_tokens((3, 7, 16), [82, 32, 18], 576, 32) == (2 * 576 + 4 * 82 + 9 * 32 + 17 * 18) / 32
    assert sv.planned_tokens((66, 30, 17), 576, 0.0) == [66, 30, 17]


def test_recycle_counts():
    # the released "64" first stage: 576 -> 66 drops 510; int(0.3 * 510) + 1 = 154 recycled, 16 clusters
    assert sv.recycle_counts(510, 0.3) == (154, 16)
    assert sv.recycle_counts(15, 0.3) == (5, 1) and sv.recycle_counts(3, 1.0) == (3, 1)
    assert sv.recycle_counts(0, 0.3) == (0, 0) and sv.recycle_counts(10, 0.0) == (0, 0)


def test_text_raters_by_hand():
    v = torch.tensor([[3.0, 0.0], [0.0, 3.0]])
    t = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    # softmax over text per visual row: [.91 .05 .05], [.05 .91 .05] -> mean [.48 .48 .05] > 1/3
    assert sv.text_raters(v, t).tolist() == [True, True, False]
    assert sv.text_raters(v[:1], t).tolist() == [True, False, False]
    assert sv.text_raters(v, t[:1]).tolist() == [True]  # one text token: none above the mean -> all


def test_rank_stage_on_hand_made_attention():
    att = torch.tensor([[.10, .30, .05, .20, .15, .20, .40],  # 2 raters over 7 keys; visual keys 1..4, 6
                        [.10, .10, .25, .30, .05, .20, .02]])
    cols, merged = torch.tensor([1, 2, 3, 4]), torch.zeros(4, dtype=torch.bool)
    pick = sv.rank_stage(att, cols, merged, 2, 0.3)  # means .20 .15 .25 .10
    torch.testing.assert_close(pick.scores, torch.tensor([.20, .15, .25, .10]))
    assert pick.kept.tolist() == [2, 0] and pick.pool.tolist() == [1, 3]
    assert pick.recycled.tolist() == [1] and pick.n_clusters == 1  # int(0.3 * 2) + 1 = 1, the most attended
    assert sv.rank_stage(att, cols, merged, 4, 0.3).pool.numel() == 0
    # a merged token (key 6, mean .21) never takes a kept slot: it joins the pool, ranked by score
    pick = sv.rank_stage(att, torch.tensor([1, 2, 3, 4, 6]), torch.tensor([False] * 4 + [True]), 2, 0.5)
    assert pick.kept.tolist() == [2, 0] and pick.pool.tolist() == [4, 1, 3]  # .21 (merged), .15, .10
    assert pick.recycled.tolist() == [4, 1]  # int(0.5 * 3) + 1 = 2


def test_dpc_knn_by_hand():
    x = torch.tensor([[0.0, 0.0], [0.0, 0.0], [4.0, 0.0], [4.0, 1.0], [0.0, 1.0]])
    # k = 2 nearest: tokens 0 and 1 coincide (density 1, the tie goes to 0); 0 has no denser token
    # (delta = max distance), 1 has delta 0; among 2, 3, 4 token 4 is nearest to the dense pair.
    centres, assign = sv.dpc_knn(x, 2)
    assert centres.tolist() == [0, 2] and assign.tolist() == [0, 0, 1, 1, 0]
    centres, assign = sv.dpc_knn(x[2:3], 1)
    assert centres.tolist() == [0] and assign.tolist() == [0]


# ------------------------------------------------------------------------------------ keep-all
@pytest.mark.parametrize("fam,media", CASES, ids=[_id(c) for c in CASES])
def test_keep_all_is_the_unpruned_model(adapters, encoded, fam, media):
    ad, enc = adapters[fam], encoded[fam, media]
    ref, ans = ad.prefill_logits(enc), ad.generate(enc, max_new_tokens=5)
    cache: dict = {}
    sel = mipruner.select(ad, enc, "sparsevlm", 1.0, cache=cache)
    assert sel.keep.tolist() == list(range(enc.n_visual)) and sel.extras["n_merged"] == 0
    assert sel.extras["layers"].tolist() == [1, 2, 3]
    assert torch.equal(sv.prefill_logits(ad, enc, sel), ref)
    for c in (cache, None):  # the prefix select left, and a replay of the stages
        got = mipruner.answer(ad, enc, sel, max_new_tokens=5, cache=c)
        assert got.token_ids == ans.token_ids
        assert got.input_tokens == ans.input_tokens and got.visual_tokens == enc.n_visual


# ------------------------------------------------------------------------------------ pruned
def _stages(enc, sel):
    """The reference's stages, read from the selection's extras (independently of `stages_of`)."""
    ex, vis = sel.extras, enc.state.visual_positions.cpu()
    L = int(enc.state.input_ids.shape[-1])
    out = []
    for s, layer in enumerate(ex["layers"].tolist()):
        made = [j for j in range(ex["merged_slot"].numel()) if int(ex["merged_stage"][j]) == s]
        hidden = torch.zeros(L, dtype=torch.bool)
        hidden[vis[ex["survived"] <= s]] = True  # dropped at this stage or before
        hidden[vis[ex["merged_slot"][made]]] = False  # ... unless the slot of this stage's merged tokens
        merges = [(int(vis[ex["merged_slot"][j]]),
                   vis[torch.cat([torch.nonzero(ex["merged_into"] == j).flatten(),  # original members
                                  ex["merged_slot"][ex["merged_parent"] == j]])])  # the last stage's merged ones
                  for j in made]
        out.append((layer, hidden, merges))
    return out


PRUNED = [("llava", "image"), ("llava_next", "image"), ("video_llava", "video"), ("qwen2_vl", "image"),
          ("qwen2_5_vl", "image"), ("qwen3_vl", "image"), ("qwen3_vl", "video")]


@pytest.mark.parametrize("fam,media", PRUNED, ids=[_id(c) for c in PRUNED])
def test_pruned_equals_the_model_with_stages_masked_and_merged(adapters, encoded, fam, media):
    ad, enc = adapters[fam], encoded[fam, media]
    k = max(1, enc.n_visual // 8)
    cache: dict = {}
    sel = mipruner.select(ad, enc, "sparsevlm", k, cache=cache)
    ex = sel.extras
    assert sel.budget == k and sel.method == "sparsevlm" and int((ex["survived"] == 3).sum()) == k
    assert ex["n_merged"] >= 1 and int(torch.bincount(ex["merged_into"][ex["merged_into"] >= 0]).max()) >= 2
    stages = _stages(enc, sel)
    inputs, step = _reference_inputs(ad, enc)
    ref_logits, ref_tokens, _ = reference_staged(ad.model, inputs, step, stages, max_new_tokens=5)
    visible = ~stages[-1][1]
    got = sv.prefill_logits(ad, enc, sel)
    n_rows = int(enc.state.input_ids.shape[-1]) - enc.n_visual + k + ex["n_merged"]
    assert got.shape[0] == int(visible.sum()) == n_rows
    torch.testing.assert_close(got, ref_logits[visible], atol=1e-5, rtol=1e-5)
    eos = set(mipruner.inllm._run._get_prompt(ad, enc, None).eos)
    cut = next((i + 1 for i, t in enumerate(ref_tokens) if t in eos), len(ref_tokens))
    for c in (cache, None):
        ans = mipruner.answer(ad, enc, sel, max_new_tokens=5, cache=c)
        assert ans.token_ids == ref_tokens[:cut]
        assert ans.input_tokens == n_rows and ans.visual_tokens == k + ex["n_merged"]
    assert not torch.allclose(got, ad.prefill_logits(enc)[visible], atol=1e-4)  # the test could fail
    # the layer-averaged visual tokens as the release logs them (each layer: the count after it);
    # with stages at 1, 2, 3 of 4 layers: layer 0 after stage 1, layer 1 after stage 2, layers 2-3 after stage 3
    after = [int(c) + int((ex["merged_stage"] == s).sum()) for s, c in enumerate(ex["counts"])]
    assert after == sv.planned_tokens(ex["counts"].tolist(), enc.n_visual, 0.3)
    assert ex["equivalent_tokens"] == pytest.approx((after[0] + after[1] + 2 * after[2]) / DEPTH)
    if fam == "llava_next":  # merged tokens re-merged at the next stage (and a slot reused) are covered
        assert (ex["merged_parent"] >= 0).any()
    assert ex["n_merged"] == int((ex["merged_stage"] == 2).sum())


def test_recycling_off(adapters, encoded):
    ad, enc = adapters["llava"], encoded["llava", "image"]
    sel = mipruner.select(ad, enc, "sparsevlm", 2, recycle_ratio=0.0)
    assert sel.extras["n_merged"] == 0 and (sel.extras["merged_into"] == -1).all()
    stages = _stages(enc, sel)
    inputs, step = _reference_inputs(ad, enc)
    ref_logits, ref_tokens, _ = reference_staged(ad.model, inputs, step, stages, max_new_tokens=4)
    visible = ~stages[-1][1]
    assert int(visible.sum()) == int(enc.state.input_ids.shape[-1]) - enc.n_visual + 2
    torch.testing.assert_close(sv.prefill_logits(ad, enc, sel), ref_logits[visible], atol=1e-5, rtol=1e-5)
    eos = set(mipruner.inllm._run._get_prompt(ad, enc, None).eos)
    cut = next((i + 1 for i, t in enumerate(ref_tokens) if t in eos), len(ref_tokens))
    assert mipruner.answer(ad, enc, sel, max_new_tokens=4).token_ids == ref_tokens[:cut]


# ------------------------------------------------------------------------------------ attention
@pytest.mark.parametrize("fam", ["llava", "qwen3_vl"])
def test_stage_scores_are_the_raters_eager_attention(paths, adapters, encoded, fam):
    ad, enc = adapters[fam], encoded[fam, "image"]
    eager = _eager(paths, fam)
    sel = mipruner.select(ad, enc, "sparsevlm", max(1, enc.n_visual // 8))
    ex = sel.extras
    stages = _stages(enc, sel)
    inputs, _ = _reference_inputs(ad, enc)
    with hide_by_stage(eager, stages, additive=True):
        att = eager(**inputs, output_attentions=True).attentions
    vis, raters = enc.state.visual_positions.cpu(), ex["raters"]
    for s, layer in enumerate(ex["layers"].tolist()):
        ranked = ex["survived"] >= s  # the tokens present (not merged) when stage s ranks
        expected = att[layer - 1][0].float().mean(0)[raters][:, vis[ranked]].mean(0)
        torch.testing.assert_close(ex["stage_scores"][s, ranked], expected, atol=1e-6, rtol=1e-5)
        assert torch.isnan(ex["stage_scores"][s, ~ranked]).all()
    if fam in LLAVA:  # the raters: the text after the image above the mean relevance, from the input embeddings
        embeds = ad.pruned_inputs(enc, None)["inputs_embeds"][0]
        after = torch.arange(int(vis.max()) + 1, embeds.shape[0])
        assert raters.tolist() == after[sv.text_raters(embeds[vis], embeds[after])].tolist()


# ------------------------------------------------------------------------------------ cache, errors
def test_cache_reuses_the_first_stage_and_the_selected_prefix(adapters, encoded):
    ad, enc = adapters["qwen2_vl"], encoded["qwen2_vl", "image"]
    with decoder_layer_calls(ad) as calls:
        cache: dict = {}
        a = mipruner.select(ad, enc, "sparsevlm", 2, cache=cache)
        assert calls == [1, 1, 1, 0]  # stages at 1, 2, 3: layers 0..2 once
        b = mipruner.select(ad, enc, "sparsevlm", 4, cache=cache)
        assert calls == [1, 2, 2, 0]  # another budget: layer 0 (before the first stage) reused
        assert torch.equal(mipruner.select(ad, enc, "sparsevlm", 2, cache=cache).keep, a.keep)
        assert calls == [1, 2, 2, 0]  # the same budget again: no layer
        ans = mipruner.answer(ad, enc, b, max_new_tokens=3, min_new_tokens=3, cache=cache)
        assert calls == [1 + 2, 2 + 2, 2 + 2, 1 + 2]  # prompt: layer 3 only; then 2 decoding steps
        again = mipruner.answer(ad, enc, a, max_new_tokens=3, min_new_tokens=3, cache=cache)
        assert calls == [3 + 3, 4 + 3, 4 + 3, 3 + 3]  # not the latest selection: its stages replayed
        assert len(ans.token_ids) == len(again.token_ids) == 3


def test_errors(adapters, encoded):
    ad, enc = adapters["llava"], encoded["llava", "image"]
    assert mipruner.get_pruner("sparsevlm").defaults() == {"recycle_ratio": 0.3}
    with pytest.raises(ValueError, match="recycle_ratio"):
        mipruner.select(ad, enc, "sparsevlm", 4, recycle_ratio=1.5)
    with pytest.raises(ValueError, match="budget"):
        mipruner.select(ad, enc, "sparsevlm", enc.n_visual + 1)
    fastv = mipruner.select(ad, enc, "fastv", 4, layer=1)
    with pytest.raises(ValueError, match="SparseVLM selection"):
        sv.answer(ad, enc, fastv, max_new_tokens=2)
    with pytest.raises(ValueError, match="SparseVLM selection"):
        sv.prefill_logits(ad, enc, fastv)
