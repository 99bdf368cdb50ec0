"""LLaVA-PruMerge, the example adaptive merging plug-in (examples/prumerge):

  release      on random tensors with [CLS] attention of varied peakiness (20 cases, N = 48..576):
               the kept patches (topk order), their merged rows and the extra token equal a
               restatement of the released code (tests/examples/prumerge_reference.py) to 1e-5;
  adaptive     K is chosen per input (different inputs, different K; the budget caps it) and the
               selection passes the contract through prune and select (tokens per kept index, the
               extra token as `prefix`, counted in K);
  model        through `mipruner.select` on the embedded model: the same rule on the encoding's
               [CLS] row, keys and projected tokens, and the answer runs on its merged tokens.
"""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.testing import check_pruner, embedded_encoding

from .prumerge_reference import released_prumerge


def _case(seed: int, n: int, c: int, d: int, peak: float):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n + 1, n + 1, generator=g) * peak
    attention = torch.softmax(logits, dim=-1)
    keys = torch.randn(n + 1, c, generator=g)
    visual = torch.randn(n, d, generator=g)
    return attention, keys, visual


CASES = [(s, n, c, d, peak) for s, (n, c, d, peak) in enumerate(
    [(48, 8, 16, 1.0), (48, 8, 16, 3.0), (100, 16, 32, 2.0), (100, 16, 32, 4.0), (576, 64, 64, 2.5)] * 4)]


@pytest.mark.parametrize("seed,n,c,d,peak", CASES)
def test_equals_the_released_code(prumerge, seed, n, c, d, peak):
    attention, keys, visual = _case(seed, n, c, d, peak)
    idx, updated = released_prumerge(attention[0, 1:], keys[1:], visual)
    if idx.numel() == 0:
        pytest.skip("no outlier: the release keeps no patch (ours keeps the top one)")
    sel = mipruner.prune("prumerge", visual=visual, budget=n, attention=attention, keys=keys)
    assert sel.order.tolist() == idx.tolist() and sel.budget == idx.numel() + 1 < n
    torch.testing.assert_close(sel.tokens, updated[:-1][torch.argsort(idx)], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sel.prefix, updated[-1:], atol=1e-5, rtol=1e-5)


def test_k_is_chosen_per_input_and_capped(prumerge):
    ks = set()
    for seed, n, c, d, peak in CASES[:10]:
        attention, keys, visual = _case(seed, n, c, d, peak)
        sel = mipruner.prune("prumerge", visual=visual, budget=n, attention=attention, keys=keys)
        ks.add(sel.budget)
        capped = mipruner.prune("prumerge", visual=visual, budget=3, attention=attention, keys=keys)
        assert capped.budget <= 3 and capped.keep.numel() == capped.budget - 1 and capped.prefix.shape[0] == 1
    assert len(ks) >= 3  # K differs between inputs
    assert mipruner.get_pruner("prumerge").adaptive


def test_contract_and_the_model(prumerge):
    assert check_pruner("prumerge", model=None) == []
    ad, enc = embedded_encoding()
    cache: dict = {}
    sel = mipruner.select(ad, enc, "prumerge", enc.n_visual, cache=cache)
    idx, updated = released_prumerge(enc.attention[0, 1:].float(), enc.keys[1:].float(), enc.visual.float())
    assert sel.order.tolist() == idx.tolist()
    torch.testing.assert_close(sel.tokens.float(), updated[:-1][torch.argsort(idx)], atol=1e-4, rtol=1e-4)
    ans = mipruner.answer(ad, enc, sel, max_new_tokens=4, cache=cache)
    assert ans.visual_tokens == sel.budget


def test_the_panel_draws_which_patch_went_into_which(prumerge):
    """`Selection.merged_into` is checked by the contract and drawn in the method's panel (the
    engine's merge map), while a method that merges nothing shows none."""
    from PIL import Image

    from components.page.panels import method_notes, panel_fields
    from mipruner.serve.service import ModelService
    from mipruner.pruners.selection import selection_failures

    ad, _ = embedded_encoding()
    engine = ModelService(ad)
    s = engine.new_session()
    img = Image.open(str(__import__("pathlib").Path(__file__).resolve().parents[2] / "assets" / "examples"
                         / "scene_0.png")).convert("RGB")
    key = engine.encode(s, img, "Is there a red circle?", methods=["prumerge", "random"])
    merged, plain = engine.view(s, key, ["prumerge", "random"], 32)
    sel = merged.selection
    into = sel.merged_into
    assert into is not None and (into >= 0).any() and torch.isin(into[into >= 0], sel.keep).all()
    assert not torch.isin(sel.keep, torch.nonzero(into >= 0).flatten()).any()  # kept ones are targets only
    assert selection_failures(sel, n=into.numel(), k=sel.budget) == []
    assert merged.pivot is not None and merged.legend and merged.legend[0][0].startswith("token ")
    assert plain.pivot is None
    assert f"K = {sel.budget} chosen per input" in method_notes(sel) and "chosen per input" not in method_notes(plain.selection)
    assert "of unpruned" in method_notes(plain.selection)  # every panel carries its selection's compute
    fields = panel_fields([merged, plain], into.numel(), None, "")
    props, image = fields[3]
    assert props["visible"] and "merged into" in props["label"] and image is merged.pivot
    bad = mipruner.Selection(keep=sel.keep, order=sel.order, scores=sel.scores, merged_into=torch.full_like(into, into.numel()))
    assert any("merged_into" in f for f in selection_failures(bad, n=into.numel(), k=sel.keep.numel()))
