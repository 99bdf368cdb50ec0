"""The random-weight InternVL3 builder of the benches (tiny shape; the real shapes' configs): it encodes
and answers, and the 8B / 1B configs are the public ones'."""
from __future__ import annotations

import pytest
import torch

from mipruner.models.internvl.random_weights import build

from .tiny_llava import scene


def test_internvl_random_builder_encodes_and_answers():
    ad, desc = build(tiny=True, device="cpu", dtype=torch.float32)
    assert "InternVL3" in desc and ad.family == "internvl"
    with torch.no_grad():
        enc = ad.encode(scene(160, 90), "what is in the image ?", need_attention=True)
        seq = ad.processor.image_seq_length
        assert enc.n_visual == 3 * seq and enc.geometry.grids == [(4, 8), (4, 4)]  # 2 x 1 tiles + thumbnail
        assert enc.attention.shape == (enc.n_visual + 1, enc.n_visual + 1)
        ref = ad.model(**enc.state.ref).logits[0].float()
        torch.testing.assert_close(ad.prefill_logits(enc), ref, atol=1e-5, rtol=0)
        ans = ad.generate(enc, keep=torch.arange(0, enc.n_visual, 3), max_new_tokens=3)
        assert 1 <= len(ans.token_ids) <= 3 and ans.visual_tokens == len(range(0, enc.n_visual, 3))


@pytest.mark.parametrize("shape,layers,width,tied", [("8B", 28, 3584, False), ("1B", 24, 896, True)])
def test_internvl_random_builder_real_shapes(shape, layers, width, tied):
    """The real shapes on the meta device (no memory): InternViT-300M at 448 px, 256 tokens a tile."""
    ad, desc = build(tiny=False, device="meta", dtype=torch.bfloat16, shape=shape)
    v, t = ad.config.vision_config, ad.config.text_config
    assert (v.num_hidden_layers, v.hidden_size, v.intermediate_size, v.num_attention_heads) == (24, 1024, 4096, 16)
    assert tuple(v.image_size) == (448, 448) and tuple(v.patch_size) == (14, 14) and v.attention_bias
    assert (t.num_hidden_layers, t.hidden_size, ad.config.tie_word_embeddings) == (layers, width, tied)
    assert ad.processor.image_seq_length == 256 == ad.owner.shape[0] and ad.image_processor.max_patches == 12
    assert f"InternVL3-{shape}" in desc
    with pytest.raises(ValueError, match="shape"):
        build(tiny=False, device="meta", dtype=torch.bfloat16, shape="2B")
