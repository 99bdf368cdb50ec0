"""LLaVA-OneVision's `views="base"`: one image read as its base view only (the app's "fewer views for speed").

The base view is the processor's own first view (same pixels, same tokens as the anyres encoding's first g x g),
followed by one newline as the model packs a one-view image; keeping every token gives the model's own logits on
those inputs (the anchor); other families refuse it in a sentence."""
from __future__ import annotations

import pytest
import torch

import mipruner

from ..no_grad import seeded_no_grad  # noqa: F401  (autouse: autograd off for this module)
from .anchor import assert_keep_all_is_the_unpruned_model
from .tiny_llava import scene
from .tiny_onevision import IMAGE_SIZE, PATCH, save_tiny

PROMPT = "What colour is the square?"
G = IMAGE_SIZE // PATCH


@pytest.fixture(scope="module")
def onevision(tmp_path_factory):
    return mipruner.load(save_tiny(str(tmp_path_factory.mktemp("onevision") / "ov")), device="cpu")


@pytest.fixture(scope="module")
def pair(onevision):
    im = scene(200, 120, square=(20, 20, 60, 60))
    return (im, onevision.encode(im, PROMPT, need_attention=True),
            onevision.encode(im, PROMPT, need_attention=True, views="base"))


def test_base_view_is_the_first_view_of_the_anyres_encoding(onevision, pair):
    im, full, base = pair
    assert full.n_visual > G * G + 1 and base.n_visual == G * G + 1
    assert list(base.geometry.kind) == ["base"] * (G * G) + ["newline"]
    # the same pixels as the processor's first view
    ref = onevision.processor(images=[[im]], text=base.state.templated, return_tensors="pt")
    assert torch.equal(base.state.ref["pixel_values"], ref["pixel_values"][:, :1])
    # the same tokens (the tower batched over 5 views or 1: float rounding only) and the same boxes
    torch.testing.assert_close(base.visual[: G * G], full.visual[: G * G], atol=1e-6, rtol=0)
    assert torch.equal(base.geometry.box[: G * G], full.geometry.box[: G * G])
    # the newline: the model's image_newline, its box the whole image
    torch.testing.assert_close(base.visual[-1], full.visual[-1], atol=1e-6, rtol=0)
    assert base.geometry.box[-1].tolist() == [0.0, 0.0, 200.0, 120.0]
    # the text around the image is the same
    vis = onevision.model.config.image_token_id
    assert base.state.input_ids[base.state.input_ids != vis].tolist() == \
        full.state.input_ids[full.state.input_ids != vis].tolist()
    assert base.attention.shape == (G * G + 1, G * G + 1) and float(base.attention[-1].abs().sum()) == 0.0


def test_base_view_keep_all_is_the_unpruned_model(onevision, pair):
    _, _, base = pair
    assert base.state.ref["pixel_values"].shape[1] == 1  # the model reads one view, through its own path
    assert_keep_all_is_the_unpruned_model(onevision, base)


def test_base_view_features_and_pruning(onevision, pair):
    im, _, _ = pair
    e = onevision.encode(im, PROMPT, need_attention=True, views="base", signals=mipruner.Signals(features=True))
    assert e.features.shape == (e.n_visual, onevision.model.config.vision_config.hidden_size)
    assert float(e.features[-1].abs().sum()) == 0.0 and float(e.features[0].abs().sum()) > 0.0
    sel = mipruner.select(onevision, pair[2], "mi", 5)
    assert len(sel.keep) == 5


def test_views_refused_in_a_sentence(onevision, tmp_path):
    with pytest.raises(ValueError, match="views must be 'all' or 'base'"):
        onevision.encode(scene(40, 40), PROMPT, views="tiles")
    from .tiny_llava import save_tiny as save_llava

    llava = mipruner.load(save_llava("llava", str(tmp_path / "llava")), device="cpu")
    with pytest.raises(ValueError, match="views='base' is for the anyres families"):
        llava.encode(scene(40, 40), PROMPT, views="base")


def test_base_view_default_is_all(onevision, pair):
    im, full, _ = pair
    assert onevision.encode(im, PROMPT).n_visual == full.n_visual


def test_engine_keys_the_views(onevision, pair):
    from mipruner.serve.service import ModelService

    im = pair[0]
    engine = ModelService(onevision, name="tiny-ov")
    s = engine.new_session()
    k_all = engine.encode(s, im, PROMPT, need_attention=True)
    k_base = engine.encode(s, im, PROMPT, need_attention=True, views="base")
    assert k_all != k_base and k_base.views == "base" and k_all.views == "all"
    assert engine.encoded(s, k_base).n_visual == G * G + 1 < engine.encoded(s, k_all).n_visual
    assert engine.encode(s, im, PROMPT, need_attention=True, views="base") == k_base  # cached
    # a method asking for more signals re-encodes the base-view entry in place, still one view
    engine.encode(s, im, PROMPT, need_attention=True, views="base", methods=["vispruner"])
    assert engine.encoded(s, k_base).n_visual == G * G + 1 and engine.encoded(s, k_base).features is not None
