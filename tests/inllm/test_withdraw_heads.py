"""Two published in-LLM rules as plug-ins outside the package (files in tmp_path, loaded as
`--plugins` loads them), each against an independent restatement on the embedded model:

  withdraw  every visual token withdrawn from layer k on (VTW's rule, "Boosting Multimodal Large
            Language Models with Visual Tokens Withdrawal", arXiv 2405.05803): the logits equal
            the model's own forward up to layer k (`output_hidden_states`) followed by layers k..
            run on the text rows alone; the checker passes it; masks, panels and eval say "all
            withdrawn from layer k"; a pre-LLM method keeping none is refused with the rule in the sentence;
  max-head  the per-head maximum of the last prompt token's attention at layer k-1 ranks the
            visual tokens: its kept set equals the one from the model's own eager attention
            probabilities (`output_attentions=True`), and `StageView.attention(heads=True)` equals
            those probabilities, (H, R, L), for both `layer="previous"` and `layer="this"`.

Floats from two code paths are compared within a tolerance stated in float32 eps units; kept sets
(decisions) exactly.
"""
from __future__ import annotations

import textwrap

import pytest
import torch

import mipruner
from mipruner import plugins as P
from mipruner.inllm import DecoderRun, staged_prefill_logits
from mipruner.inllm._prompt import prompt_of
from mipruner.testing import check_pruner, embedded_encoding
from tests.no_grad import no_grad  # noqa: F401
from tests.plugin_registry import registry_restored

EPS = torch.finfo(torch.float32).eps
LAYER = 2  # of the embedded model's 3 decoder layers

PLUGIN = '''
import torch
from mipruner import Param, Selection
from mipruner.inllm import register_inllm

@register_inllm("withdraw_test", label="Withdraw all (VTW rule)",
                params=(Param.integer("withdraw_layer", 2, 1, None, "layer from which no visual token remains"),))
def withdraw_test(run, budget, *, withdraw_layer=2):
    """Every visual token withdrawn from layer `withdraw_layer` on; the text goes on alone."""
    view = run.at(withdraw_layer)
    run.keep(view, [])
    scores = torch.zeros(run.n_visual, device=run.visual_positions.device)
    return Selection.from_order(torch.zeros(0, dtype=torch.long, device=scores.device), scores)

@register_inllm("maxhead_test", label="Per-head max",
                params=(Param.integer("maxhead_layer", 2, 1, None, "layer whose input loses the tokens"),))
def maxhead_test(run, budget, *, maxhead_layer=2):
    """The visual tokens the last prompt token attends to most in any one head, at layer k-1."""
    view = run.at(maxhead_layer)
    att = view.attention("last", heads=True)[:, 0]           # (H, L) per head
    scores = att.max(dim=0).values[view.columns(run.visual_positions)]
    order = torch.sort(scores, descending=True, stable=True).indices[:budget]
    run.keep(view, order)
    return Selection.from_order(order, scores)
'''

PRE_LLM = '''
import torch
from mipruner import Selection, register_pruner

@register_pruner("none_pre_test")
def none_pre_test(visual, text, budget):
    """Keeps nothing before the LLM (which the contract refuses)."""
    return Selection.from_order(torch.zeros(0, dtype=torch.long, device=visual.device),
                                torch.zeros(visual.shape[0], device=visual.device))
'''


@pytest.fixture
def loaded(tmp_path):
    with registry_restored(tmp_path):
        path = tmp_path / "vtw_like.py"
        path.write_text(textwrap.dedent(PLUGIN))
        P.load_plugins(str(path))
        assert {"withdraw_test", "maxhead_test"} <= set(mipruner.list_pruners()), P.problems()
        yield tmp_path


@pytest.fixture(scope="module")
def model():
    return embedded_encoding()


@pytest.fixture
def eager(model):
    """The embedded model's decoder switched to eager attention (so it returns its probabilities), restored after."""
    ad, _ = model
    before = ad.model.config._attn_implementation
    ad.model.set_attn_implementation("eager")
    yield model
    ad.model.set_attn_implementation(before)


def _own_forward(ad, enc, **kw):
    """The decoder's own forward on the full prompt (its public inputs)."""
    p = prompt_of(ad, enc)
    return p, ad.text_decoder()(inputs_embeds=p.embeds, position_ids=p.layer_positions, use_cache=False, **kw)


def test_withdraw_every_token_equals_text_only_after_layer_k(loaded, model):
    ad, enc = model
    sel = mipruner.select(ad, enc, "withdraw_test", 4, withdraw_layer=LAYER)
    assert sel.keep.numel() == 0 and sel.extras["withdrawn_at"] == LAYER and sel.budget == 0
    got = staged_prefill_logits(ad, enc, sel)  # (N_T, vocab): the text rows only
    # restatement: the model's forward up to layer k, then layers k.. on the text rows alone
    p, out = _own_forward(ad, enc, output_hidden_states=True)
    lm = ad.text_decoder()
    vis = p.visual_positions
    text = torch.ones(p.length, dtype=torch.bool)
    text[vis] = False
    rows = torch.nonzero(text).flatten()
    h = out.hidden_states[LAYER][:, rows]  # input of layer k, text rows
    pos = p.layer_positions[:, rows]  # their original positions (FastV's semantics)
    pe = lm.rotary_emb(h, pos)
    for layer in lm.layers[LAYER:]:
        h = layer(h, attention_mask=None, position_embeddings=pe, position_ids=pos)  # causal (no mask given)
        h = h[0] if isinstance(h, tuple) else h
    want = ad.output_head()(lm.norm(h))[0].float()
    assert got.shape == want.shape
    scale = float(want.abs().max())
    assert torch.allclose(got, want, rtol=0, atol=64 * EPS * scale), float((got - want).abs().max())
    ans = mipruner.answer(ad, enc, sel, max_new_tokens=3)
    assert ans.visual_tokens == 0 and ans.input_tokens == int(rows.numel())
    assert check_pruner("withdraw_test", adapter=ad, encoded=enc) == []


def test_withdrawal_is_shown_in_masks_panels_and_eval(loaded, model):
    from components.page.panels import method_notes
    from mipruner import viz
    from mipruner.eval.runner import evaluate, format_rows
    from mipruner.eval.shapes import shapes_items

    ad, enc = model
    sel = mipruner.select(ad, enc, "withdraw_test", 4, withdraw_layer=LAYER)
    assert viz.kept_mask(enc, sel).info["label"] == f"all withdrawn from layer {LAYER}"
    notes = method_notes(sel)
    assert f"all withdrawn from layer {LAYER}" in notes and "prefill " in notes and "% of unpruned" in notes
    c = sel.extras["compute"]
    assert c.visual_rows == (enc.n_visual,) * LAYER + (0,) * (len(ad.text_decoder().layers) - LAYER)
    rows = evaluate(ad, shapes_items("shapes-open", n=1), ["none", "withdraw_test"], [4], {"withdraw_layer": LAYER},
                    "t", max_new_tokens=2)
    row = next(r for r in rows if r["method"] == "withdraw_test")
    assert row["kept"] == 0 and row["withdrawn"] == f"all withdrawn from layer {LAYER}" and row["failed"] == 0
    assert f"0.0 (all withdrawn from layer {LAYER})" in format_rows(rows)


def test_pre_llm_method_keeping_none_is_refused_with_its_rule(loaded, model):
    path = loaded / "none_pre.py"
    path.write_text(textwrap.dedent(PRE_LLM))
    P.load_plugins(str(path))  # its quick check at load refuses it, with the rule
    assert "none_pre_test" not in mipruner.list_pruners()
    msg = " ".join(P.problems())
    assert "a fixed-K method keeps exactly K = 1" in msg and "a pre-LLM method keeps at least one" in msg, msg


def test_per_head_attention_is_the_models_own(loaded, eager):
    ad, enc = eager
    p, out = _own_forward(ad, enc, output_attentions=True)
    run = DecoderRun(p, None, "original")
    view = run.at(LAYER)
    text = run.text_positions
    for layer, att in (("previous", out.attentions[LAYER - 1]), ("this", out.attentions[LAYER])):
        got = view.attention("text", layer=layer, heads=True)  # (H, R, L)
        want = att[0].index_select(1, text).float()
        assert got.shape == want.shape == (ad.text_decoder().config.num_attention_heads, text.numel(), p.length)
        assert torch.allclose(got, want, rtol=0, atol=16 * EPS), float((got - want).abs().max())
        assert torch.allclose(view.attention("text", layer=layer), want.mean(0), rtol=0, atol=16 * EPS)


def test_per_head_maximum_equals_its_restatement(loaded, eager):
    ad, enc = eager
    budget = 12
    sel = mipruner.select(ad, enc, "maxhead_test", budget, maxhead_layer=LAYER)
    p, out = _own_forward(ad, enc, output_attentions=True)
    row = out.attentions[LAYER - 1][0, :, p.length - 1].float()  # (H, L) the last prompt token, per head
    scores = row.max(dim=0).values[p.visual_positions]
    assert torch.allclose(sel.scores, scores, rtol=0, atol=16 * EPS)
    gaps = torch.sort(scores, descending=True).values
    assert float(gaps[budget - 1] - gaps[budget]) > 64 * EPS  # the cut is no float tie
    want = torch.sort(torch.sort(scores, descending=True, stable=True).indices[:budget]).values
    assert torch.equal(sel.keep.cpu(), want)
