"""VisionZip's [CLS] on the CLIP families (tiny checkpoints built offline): the adapters supply the
projected [CLS] of every view, VisionZip keeps it as one of the K tokens, and the adapters feed it.

  Encoded.cls   equals the projector applied to the tower's own [CLS] hidden state at the feature
                layer (recomputed here from `vision_tower(..., output_hidden_states=True)`), one row
                per view; None without need_attention, under Video-LLaVA video and on Qwen;
  prefill       the pruned prompt is [text before, [CLS], kept rows at their image order, text after]:
                logits equal the model's own forward on that sequence, built by hand here;
  keep-all      VisionZip at K = N_V is the unpruned model exactly (no [CLS] added);
  elsewhere     paths that cannot feed the [CLS] row refuse the selection instead of dropping it.
"""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner import inllm

from ..models.tiny_llava import save_tiny, scene
from ..no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)

PROMPT = "What colour is the square?"
FAMILIES = ("llava", "llava_next", "video_llava")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("vz_cls")
    return {fam: mipruner.load(save_tiny(fam, str(root / fam)), device="cpu") for fam in FAMILIES}


@pytest.fixture(scope="module")
def encoded(adapters):
    image = scene(112, 56, square=(70, 14, 84, 28))
    return {fam: adapters[fam].encode(image, PROMPT, need_attention=True) for fam in FAMILIES}


def _tower_cls(ad, enc):
    """The projected [CLS] recomputed from the tower's hidden states (independent of the adapter)."""
    model = ad.model.model
    image = enc.frames[0]
    if ad.family == "llava_next":
        inputs = ad.processor(images=image, text="<image>", return_tensors="pt")
        pixels = inputs["pixel_values"][0]  # (views, 3, h, w)
        tower = model.vision_tower
    elif ad.family == "llava":
        pixels = ad.processor(images=[image], text="<image>", return_tensors="pt")["pixel_values"]
        tower = model.vision_tower
    else:
        pixels = ad.image_processor(images=[image], return_tensors="pt",
                                    return_legacy_image_output=False)["pixel_values"]
        tower = model.image_tower
    hs = tower(pixels, output_hidden_states=True).hidden_states[ad.config.vision_feature_layer]  # (views, n+1, D)
    return model.multi_modal_projector(hs[:, 0])  # (views, d)


@pytest.mark.parametrize("fam", FAMILIES)
def test_encoded_cls_is_the_projected_tower_cls(adapters, encoded, fam):
    ad, enc = adapters[fam], encoded[fam]
    want = _tower_cls(ad, enc)
    assert enc.cls is not None and enc.cls.shape == want.shape == (want.shape[0], enc.visual.shape[1])
    assert want.shape[0] == (3 if fam == "llava_next" else 1)  # LLaVA-NeXT: base view + 2 tiles (112 x 56 px)
    torch.testing.assert_close(enc.cls, want, atol=1e-6, rtol=1e-5)
    assert ad.encode(enc.frames[0], PROMPT).cls is None  # only with the attention


@pytest.mark.parametrize("fam", FAMILIES)
def test_visionzip_feeds_the_cls_row(adapters, encoded, fam):
    ad, enc = adapters[fam], encoded[fam]
    n_v, k = enc.n_visual, 8
    sel = mipruner.select(ad, enc, "visionzip", k)
    p = enc.cls.shape[0]
    assert sel.budget == k and sel.keep.numel() == k - p and torch.equal(sel.prefix, enc.cls)
    # the pruned sequence by hand: text before the image, the [CLS] rows, the kept rows in image order, the rest
    ids = enc.state.input_ids
    vpos = enc.state.visual_positions
    text = enc.text
    first = int(vpos[0])
    n_before = first  # the visual block is contiguous here and text rows are in prompt order
    seq = torch.cat([text[:n_before], enc.cls, sel.tokens, text[n_before:]]).unsqueeze(0)
    assert seq.shape[1] == ids.numel() - n_v + k
    want = ad.model(inputs_embeds=seq, attention_mask=torch.ones(1, seq.shape[1], dtype=torch.long)).logits[0]
    got = ad.prefill_logits(enc, sel)
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5)
    ans = mipruner.answer(ad, enc, sel, max_new_tokens=3)
    assert ans.visual_tokens == k and ans.input_tokens == ids.numel() - n_v + k
    # without the prefix the logits differ: the [CLS] row really is read
    bare = mipruner.Selection(keep=sel.keep, order=sel.order, scores=sel.scores, tokens=sel.tokens)
    assert not torch.allclose(ad.prefill_logits(enc, bare)[-1], got[-1], atol=1e-4)


@pytest.mark.parametrize("fam", FAMILIES)
def test_visionzip_keep_all_is_the_unpruned_model(adapters, encoded, fam):
    ad, enc = adapters[fam], encoded[fam]
    sel = mipruner.select(ad, enc, "visionzip", enc.n_visual)
    assert sel.prefix is None and sel.keep.tolist() == list(range(enc.n_visual))
    assert torch.equal(ad.prefill_logits(enc, sel), ad.prefill_logits(enc))


def test_paths_without_the_cls_refuse_it(adapters, encoded):
    ad, enc = adapters["llava"], encoded["llava"]
    sel = mipruner.select(ad, enc, "visionzip", 6)
    assert sel.prefix is not None
    with pytest.raises(ValueError, match="prefix"):
        inllm.prefill_logits(ad, enc, mipruner.Selection(keep=sel.keep, order=sel.order, scores=sel.scores,
                                                         prefix=sel.prefix), layer=1)
    with pytest.raises(ValueError, match="prefix"):
        mipruner.models.keep_indices(sel, enc.n_visual)
