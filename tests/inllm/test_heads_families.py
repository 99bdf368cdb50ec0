"""`StageView.attention(heads=True)` in every family that runs in-LLM methods (the family table): per head,
(H, R, L), equal to the attention probabilities the model's own forward computes (its decoder switched to
eager attention, read by a forward hook on the layer's attention module during `adapter.prefill_logits`,
the model's forward on the full prompt), for the layer before the stage ("previous") and the stage's own
("this"). Two code paths: within 16 float32 eps. Also: the prompt rows `mipruner.measure.compute` counts
(N_T + N_V) are the prompt's, and FastV's compute is counted stage by stage, in every family."""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.inllm import DecoderRun
from mipruner.inllm._prompt import prompt_of
from mipruner.models import FAMILIES

from ..models.tiny import save_tiny
from ..models.tiny_llava import scene
from ..no_grad import no_grad  # noqa: F401

EPS = torch.finfo(torch.float32).eps


@pytest.mark.parametrize("family", list(FAMILIES))
def test_per_head_reads_are_the_models_own(family, tmp_path):
    ad = mipruner.load(save_tiny(family, str(tmp_path / family)), device="cpu")
    ad.model.set_attn_implementation("eager")  # so that its attention modules return their probabilities
    enc = ad.encode(scene(120, 40, square=(80, 10, 100, 30)), "What colour is the square?")
    lm = ad.text_decoder()
    seen = {}
    hooks = [lm.layers[i].self_attn.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(i, out[1]))
             for i in (0, 1)]
    try:
        ad.prefill_logits(enc)  # the model's own forward on the full prompt
    finally:
        for h in hooks:
            h.remove()
    p = prompt_of(ad, enc)
    assert enc.text.shape[0] + enc.n_visual == p.length  # the rows `mipruner.measure.compute` counts are the prompt's
    c = mipruner.select(ad, enc, "fastv", 1, layer=1).extras["compute"]
    assert c.visual_rows == (enc.n_visual, *[1] * (len(ad.text_decoder().layers) - 1))
    view = DecoderRun(p, None, "original").at(1)
    text = torch.nonzero(~torch.isin(torch.arange(p.length), p.visual_positions)).flatten()
    for layer, i in (("previous", 0), ("this", 1)):
        want = seen[i][0].float()  # (H, L, L)
        assert want.shape[-1] == p.length, "the model's forward ran another sequence"
        got = view.attention("text", layer=layer, heads=True)
        assert got.shape == (lm.config.num_attention_heads, text.numel(), p.length)
        assert torch.allclose(got, want.index_select(1, text), rtol=0, atol=16 * EPS), \
            float((got - want.index_select(1, text)).abs().max())
