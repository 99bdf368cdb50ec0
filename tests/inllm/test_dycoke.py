"""DyCoke (`mipruner.inllm.dycoke`), both stages, on every family that reads video (Qwen2/2.5/3-VL,
LLaVA-OneVision, Video-LLaVA, InternVL, LLaVA-1.5 reading the frames), on an 8-frame clip:

  release     TTM's kept tokens equal the restated `dycole_ttm` (tests/inllm/dycoke_reference.py) exactly;
              at every decoding step the visual tokens the layers >= l attend to equal the restated DP's,
              and so do the greedy tokens and the last prefill row's logits (1e-5);
  keep-all    budget N_V with dycoke_k = dycoke_p = 0: the unpruned logits bit for bit and the answer;
  savings     the answer reports the visual keys attended per step (fewer than present on a pruning step),
              and `decode_compute` counts them below the unpruned decoding's;
  fidelity    the tie order (topk / stable) and the compute dtype (model / float32) options, each against
              the restatement run the same way;
  API         the decode-time stage's hook is removed after the answer; misuse is one sentence.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import mipruner
from mipruner import inllm
from mipruner.measure.compute import adapter_shape, decode_compute
from mipruner.inllm._prompt import prompt_of
from mipruner.inllm.api import DecodeStage
from mipruner.pruners.dycoke import dp_keep, ttm_keep

from ..models.test_video_methods import VIDEO, clip, encoded  # noqa: F401  (fixtures)
from ..no_grad import seeded_no_grad  # noqa: F401  (autouse: autograd off for this module)
from .dycoke_reference import released_dycoke, released_ttm


def _frames(enc):
    fi = enc.frame_index.cpu()
    t = int(fi.max()) + 1
    table = torch.stack([torch.nonzero(fi == f).flatten() for f in range(t)])  # (T, P), each frame in order
    return table, torch.nonzero(fi < 0).flatten()


def _recorded(sel):
    """`sel` whose decode-time stage also records the (N_V,) mask it returns at each step."""
    stage, log = sel.extras["decode"], []

    def fn(step):
        out = stage.fn(step)
        log.append(out.cpu().clone())
        return out

    extras = dict(sel.extras, decode=DecodeStage(stage.layer, fn))
    return dataclasses.replace(sel, extras=extras), log


@pytest.mark.parametrize("family", VIDEO)
def test_equals_the_release(encoded, family):
    a, e = encoded(family)
    cache: dict = {}
    sel = mipruner.select(a, e, "dycoke", e.n_visual, cache=cache, dycoke_k=0.7)  # the release's k and p
    table, outside = _frames(e)
    prompt = prompt_of(a, e)
    x = prompt.embeds[0, prompt.visual_positions.cpu()]
    kept_slots = released_ttm(x[table.flatten()], table.shape[1], 0.7)
    want = torch.sort(torch.cat([table[f][s] for f, s in enumerate(kept_slots)] + [outside])).values
    assert sel.keep.cpu().tolist() == want.tolist()
    assert sel.budget < e.n_visual  # TTM merged tokens away (the test could fail)
    frame_kept = want[~torch.isin(want, outside)]
    assert sel.extras["span"].tolist() == frame_kept[:-1].tolist()
    layer = sel.extras["decode_layer"]
    rec, log = _recorded(sel)
    ans = mipruner.answer(a, e, rec, max_new_tokens=6, cache=cache)
    logits, tokens, masks = released_dycoke(prompt, want, frame_kept[:-1], layer, 0.7, 6)
    assert ans.token_ids == tokens
    assert len(log) == len(masks) == len(ans.decode_visual)
    for ours, ref in zip(log, masks):
        assert torch.equal(ours, ref)
    assert list(ans.decode_visual) == [int(m.sum()) for m in masks]
    torch.testing.assert_close(inllm.staged_prefill_logits(a, e, sel)[-1], logits, atol=1e-5, rtol=1e-5)
    if masks:
        assert ans.decode_visual[0] < sel.budget  # the first step always prunes


@pytest.mark.parametrize("family", VIDEO)
def test_keep_all_is_the_unpruned_model(encoded, family):
    a, e = encoded(family)
    cache: dict = {}
    sel = mipruner.select(a, e, "dycoke", e.n_visual, cache=cache)  # the defaults: the budget decides
    assert sel.keep.tolist() == list(range(e.n_visual))
    assert torch.equal(inllm.staged_prefill_logits(a, e, sel), a.prefill_logits(e))
    ref = a.generate(e, max_new_tokens=6)
    for c in (cache, None):
        got = mipruner.answer(a, e, sel, max_new_tokens=6, cache=c)
        assert got.token_ids == ref.token_ids and got.visual_tokens == e.n_visual
        assert all(v == e.n_visual for v in got.decode_visual)


def test_decode_savings_are_counted_and_the_hook_is_removed(encoded):
    a, e = encoded("llava_onevision")
    sel = mipruner.select(a, e, "dycoke", e.n_visual, dycoke_k=0.7)
    ans = mipruner.answer(a, e, sel, max_new_tokens=6, min_new_tokens=6)
    lm = a.text_decoder()
    assert all(not layer.self_attn._forward_pre_hooks for layer in lm.layers)
    shape = adapter_shape(a)
    n_text = int(e.text.shape[0])
    ours = decode_compute(shape, n_text, e.n_visual, sel, ans)
    full = decode_compute(shape, n_text, e.n_visual, None, ans)
    assert ours.steps == full.steps == len(ans.token_ids) - 1
    assert ours.flops < full.flops and 0 < ours.flops_share < 1 and full.flops_share == 1.0
    assert ours.visual_keys == sum(ans.decode_visual[i] * (shape.layers - sel.extras["decode_layer"])
                                   + sel.budget * sel.extras["decode_layer"] for i in range(ours.steps))


def test_tie_order_option():
    x = torch.randn(1, 6, 4).expand(4, 6, 4).contiguous()  # four identical frames: every similarity ties at 1
    stable = ttm_keep(x, 0.5, ties="stable")
    assert stable[1].tolist() == [True] * 3 + [False] * 3  # ties to the lower slots
    assert stable[0].all() and stable[2].all()
    kept = released_ttm(x.flatten(0, 1), 6, 0.5)  # the release's topk on the same values
    topk = ttm_keep(x, 0.5, ties="topk")
    assert torch.nonzero(topk[1]).flatten().tolist() == sorted(kept[1].tolist())
    att = torch.tensor([0.2, 0.5, 0.5, 0.5, 0.1])
    assert dp_keep(att, None, 0.5, ties="stable").tolist() == [False, True, True, False, False]


def test_compute_dtype_option():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(1, 16, 8, generator=g)
    x = (base + 0.05 * torch.randn(8, 16, 8, generator=g)).to(torch.bfloat16)  # 8 near-alike frames
    for dtype, ref_x in (("model", x), ("float32", x.float())):
        keep = ttm_keep(x, 0.7, ties="stable", dtype=dtype)
        ref = released_ttm(ref_x.flatten(0, 1), 16, 0.7, ties="stable")
        assert [torch.nonzero(k).flatten().tolist() for k in keep] == [sorted(r.tolist()) for r in ref]


@pytest.mark.parametrize("family", ["qwen2_vl", "llava_onevision"])
def test_the_budget_decides_at_k_0(encoded, family):
    from mipruner.pruners.dycoke import pruned_frames

    a, e = encoded(family)
    table, outside = _frames(e)
    t, p = table.shape
    whole = (t - len(pruned_frames(t))) * p + outside.numel()
    for k in (whole + len(pruned_frames(t)), whole + 2 * len(pruned_frames(t)) + 1, whole - 1):
        sel = mipruner.select(a, e, "dycoke", k)
        share = max(0, (k - whole) // len(pruned_frames(t)))
        assert sel.budget == min(k, whole + share * len(pruned_frames(t))) <= k


def test_misuse_is_one_sentence(encoded):
    a, e = encoded("qwen2_vl")
    with pytest.raises(ValueError, match="dycoke_ties"):
        mipruner.select(a, e, "dycoke", e.n_visual, dycoke_ties="random")


def test_the_panel_shows_the_decoding_savings(encoded):
    from components.core.answers import answer_dict
    from components.page.panels import answer_md

    a, e = encoded("qwen2_5_vl")
    sel = mipruner.select(a, e, "dycoke", e.n_visual, dycoke_k=0.7)
    ans = mipruner.answer(a, e, sel, max_new_tokens=4, min_new_tokens=4)
    d = answer_dict(ans)
    assert d["decode_visual"] == round(sum(ans.decode_visual) / len(ans.decode_visual), 1) < sel.budget
    assert f"{d['decode_visual']} of {sel.budget} visual keys read per step from layer {d['decode_layer']}" \
        in answer_md(d, "")
    assert "decode_visual" not in answer_dict(mipruner.answer(a, e, None, max_new_tokens=4))
