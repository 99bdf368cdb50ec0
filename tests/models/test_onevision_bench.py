"""The random-weight LLaVA-OneVision builder of the benches (tiny shape): it encodes and answers."""
from __future__ import annotations

import torch

from mipruner.models.onevision.random_weights import build

from .tiny_llava import scene


def test_onevision_random_builder_encodes_and_answers():
    ad, desc = build(tiny=True, device="cpu", dtype=torch.float32)
    assert "LLaVA-OneVision" in desc and ad.family == "llava_onevision"
    with torch.no_grad():
        enc = ad.encode(scene(160, 90), "what is in the image ?", need_attention=True)
        g = ad.config.vision_config.image_size // ad.config.vision_config.patch_size
        assert enc.n_visual > g * g and enc.attention.shape == (enc.n_visual, enc.n_visual)
        ref = ad.model(**enc.state.ref).logits[0].float()
        torch.testing.assert_close(ad.prefill_logits(enc), ref, atol=1e-5, rtol=0)
        ans = ad.generate(enc, keep=torch.arange(0, enc.n_visual, 3), max_new_tokens=3)
        assert 1 <= len(ans.token_ids) <= 3 and ans.visual_tokens == len(range(0, enc.n_visual, 3))
