"""LLaVA-OneVision adapter on a tiny random checkpoint built offline (tiny_onevision.py).

The keep-all anchor for one image (a wide one and a square one whose canvas the model shrinks), several
images and a video: the adapter's input ids are the reference's, its logits are the model's own
forward on those inputs and its greedy tokens `model.generate`'s; a pruned run equals the model's
forward with the dropped tokens masked out. Inputs: images of every mode and extreme shapes go
through transformers' processor; video frames are checked against a hand restatement of the video
processor (transformers' needs torchvision). Geometry, attention pooling, every registered method.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

import mipruner
from mipruner.media import load_image, load_video, sample_indices, write_video

from ..no_grad import seeded_no_grad  # noqa: F401  (autouse: autograd off for this module)
from .anchor import assert_keep_all_is_the_unpruned_model, assert_pruned_equals_masked_full_sequence
from .boxes import best_overlap
from .tiny_llava import scene
from .tiny_onevision import IMAGE_SIZE, PATCH, save_tiny

PROMPT = "What colour is the square?"
G = IMAGE_SIZE // PATCH


@pytest.fixture(scope="module")
def onevision(tmp_path_factory):
    return mipruner.load(save_tiny(str(tmp_path_factory.mktemp("onevision") / "ov")), device="cpu")


def _media(kind, video_path):
    return {"wide": scene(120, 40, square=(80, 10, 100, 30)), "square": scene(200, 200, square=(20, 20, 60, 60)),
            "images": [scene(40, 20, seed=1), scene(30, 60, seed=2)], "video": video_path}[kind]


KINDS = ["wide", "square", "images", "video"]


@pytest.fixture(scope="module")
def encoded(onevision, video_path):
    return {k: onevision.encode(_media(k, video_path), PROMPT, need_attention=True) for k in KINDS}


def test_onevision_loads(onevision):
    assert onevision.family == "llava_onevision"
    assert onevision.model.config.vision_config._attn_implementation == "eager"


# The contract (test_family_contract.py) runs the anchor on the wide image, several images and the clip;
# here, the square image (a 2 x 2 tile grid).
@pytest.mark.parametrize("kind", ["square"])
def test_onevision_keep_all_is_the_unpruned_model(onevision, encoded, kind):
    assert_keep_all_is_the_unpruned_model(onevision, encoded[kind])


@pytest.mark.parametrize("kind", ["square"])
def test_onevision_pruned_equals_masked_full_sequence(onevision, encoded, kind):
    assert_pruned_equals_masked_full_sequence(onevision, encoded[kind])


def test_onevision_token_counts_and_layout(encoded):
    wide, square, images, video = (encoded[k] for k in KINDS)
    # wide 120x40 -> best pinpoint 64x64 (most effective pixels): a 16 x 16 canvas; the image fills
    # round(16 * 40 / 120) = 5 rows, padding (16 - 5) // 2 = 5 cut on each side: 6 rows of 16 (+ newline)
    assert wide.geometry.grids == [(G, G), (6, 16)] and wide.n_visual == G * G + 6 * 17
    # square 200x200 -> 4x4 tiles = 16x16 cells > 9 tiles' worth: shrunk by sqrt(256 / 144) to 12x12
    assert square.geometry.grids[1] == (12, 12) and square.n_visual == G * G + 12 * 13
    assert images.n_visual == 2 * (G * G + 1) and images.geometry.kind.count("newline") == 2
    f = len(video.frames)
    h = math.ceil(G / 2)
    assert video.is_video and f == 8 and video.n_visual == f * h * h + 1
    assert video.geometry.kind[-1] == "newline" and video.geometry.kind.count("frame") == f * h * h
    for e in (wide, square):  # canvas rows end with a newline at col = width
        g = e.geometry
        nl = torch.tensor([k == "newline" for k in g.kind])
        assert torch.equal(g.col[nl], torch.full((int(nl.sum()),), g.grids[1][1]))
        assert torch.equal(g.row[nl], torch.arange(g.grids[1][0]))


def test_onevision_boxes_cover_the_image_and_find_the_square(encoded):
    e = encoded["wide"]
    g = e.geometry
    W, H = 120, 40
    for kind in ("base", "tile"):
        sel = torch.tensor([k == kind for k in g.kind])
        area = ((g.box[sel, 2] - g.box[sel, 0]) * (g.box[sel, 3] - g.box[sel, 1])).sum()
        assert abs(float(area) - W * H) < 1e-3, kind  # the boxes tile the whole image exactly once
    t = best_overlap(e, "tile", 1, (80, 10, 100, 30))
    assert g.box[t, 0] >= 70 and g.box[t, 2] <= 110  # a token over the square lies on its columns
    v = encoded["video"]
    i = best_overlap(v, "frame", 3, (12, 10, 26, 24))
    assert int(v.geometry.frame[i]) == 3 and v.geometry.box[i, 0] < 26 and v.geometry.box[i, 2] > 12


def test_onevision_attention_pooled_to_tokens(encoded):
    for kind in KINDS:
        e = encoded[kind]
        g = e.geometry
        assert not e.has_cls and e.cls is None
        assert e.attention.shape == (e.n_visual, e.n_visual) and e.keys.shape[0] == e.n_visual
        nl = torch.tensor([k == "newline" for k in g.kind])
        assert float(e.attention[nl].abs().sum()) == 0 and float(e.attention[:, nl].abs().sum()) == 0
        assert not torch.equal(g.frame[:, None] == g.frame[None, :], torch.ones_like(e.attention, dtype=torch.bool)) \
            or kind == "square"
    # a view whose patches all have owners: rows sum to 1 (base view; video frames)
    for e, kind in ((encoded["wide"], "base"), (encoded["video"], "frame"), (encoded["images"], "base")):
        sel = torch.tensor([k == kind for k in e.geometry.kind])
        torch.testing.assert_close(e.attention[sel].sum(-1), torch.ones(int(sel.sum())), atol=1e-5, rtol=0)
    v = encoded["video"]  # frames never attend to each other
    f = v.geometry.frame
    other = (f[:, None] != f[None, :])
    assert float(v.attention[other].abs().sum()) == 0


def test_onevision_video_frames_as_the_video_processor(onevision, video_path, encoded):
    e = encoded["video"]
    clip = load_video(video_path, 8)
    assert clip.indices == sample_indices(clip.total_frames, 8)
    # hand restatement: resize to the processor's size with bicubic, rescale by 1/255, CLIP normalisation
    s = onevision.video
    arr = np.stack([np.asarray(f.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC), np.float64) / 255
                    for f in clip.frames])
    want = (arr - np.array(s["image_mean"])) / np.array(s["image_std"])
    got = e.state.ref["pixel_values_videos"][0].permute(0, 2, 3, 1).double().numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)
    # the placeholder expansion: one <video> token per pooled token + 1 newline
    vid = onevision.config.video_token_id
    assert int((e.state.input_ids == vid).sum()) == len(clip.frames) * math.ceil(G / 2) ** 2 + 1


@pytest.mark.parametrize("cfg,want", [({"do_sample_frames": True, "num_frames": 4}, [0, 3, 6, 9]),
                                      ({"do_sample_frames": True, "fps": 2}, [0, 2, 4, 6, 8, 10]),  # 3 s at 4 fps
                                      ({"do_sample_frames": True, "num_frames": 20}, list(range(12))),
                                      ({"num_frames": 4}, [i * 12 // 8 for i in range(8)])])
def test_onevision_video_frames_follow_the_checkpoint(tmp_path, cfg, want):
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    frames = [scene(32, 32, seed=i) for i in range(12)]
    path = write_video(frames, str(tmp_path / "c.mp4"), fps=4)
    a = mipruner.load(save_tiny(str(tmp_path / "ov"), video=cfg), device="cpu")
    e = a.encode(path, PROMPT)
    assert len(e.frames) == len(want) and e.n_visual == len(want) * math.ceil(G / 2) ** 2 + 1
    assert load_video(path, 8).fps == 4
    if cfg.get("do_sample_frames") and cfg.get("num_frames", 0) <= 12:  # transformers' own rule agrees
        meta = VideoMetadata(total_num_frames=12, fps=4)
        got = default_sample_indices_fn(meta, num_frames=cfg.get("num_frames"), fps=cfg.get("fps"))
        assert got.tolist() == want


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA", "P", "CMYK"])
def test_onevision_image_modes_match_the_processor(onevision, mode):
    base = scene(50, 30, square=(10, 5, 30, 20))
    img = base.convert(mode)
    e = onevision.encode(img, PROMPT)
    ref = onevision.processor(images=[[load_image(img)]], text=e.state.templated, return_tensors="pt")
    assert torch.equal(e.state.ref["pixel_values"], ref["pixel_values"])
    assert torch.equal(e.state.input_ids.cpu(), ref["input_ids"][0])


@pytest.mark.parametrize("size", [(300, 3), (3, 300), (700, 7), (1, 1)])
def test_onevision_extreme_shapes(onevision, size):
    e = onevision.encode(scene(*size), PROMPT)
    W, H = size
    g = e.geometry
    assert len(g) == e.n_visual and float(g.box[:, 2].max()) <= W and float(g.box[:, 3].max()) <= H
    ref = e.state.ref
    torch.testing.assert_close(onevision.prefill_logits(e), onevision.model(**ref).logits[0].float(), atol=1e-5, rtol=0)


def test_onevision_errors(onevision, video_path):
    with pytest.raises(ValueError, match="prompt"):
        onevision.encode(scene(), "  ")
    e = onevision.encode(scene(), PROMPT)
    with pytest.raises(ValueError, match="keep"):
        onevision.prefill_logits(e, keep=torch.tensor([e.n_visual]))


@pytest.mark.parametrize("positions", ["compact", "original"])
@pytest.mark.parametrize("kind", ["wide", "images", "video"])
def test_onevision_batch_equals_one_by_one(onevision, encoded, kind, positions):
    """Several selections of one encoding as one left-padded batch give the one-by-one answers
    (batch_check's tie rule); the GPU path (bucketed lengths, static cache) keeps the keep-all answer."""
    from .batch_check import assert_selections_batch_equals_one_by_one

    # tokens are compared up to each row's first near-tie; the tiny random Qwen2 has more near-ties
    # than the LLaMA of tiny_llava (wide-original: 21 of 30 steps), hence half rather than 3/4
    assert_selections_batch_equals_one_by_one(onevision, encoded[kind], positions, min_share=0.5)


def test_onevision_several_images_as_the_official_chat_template(onevision):
    """transformers' processor through `apply_chat_template` reads two images of one message as one
    prompt's images (batch_num_images [2], no tiles): the adapter gives the same ids and logits."""
    import transformers as tf

    from .official import messages, processor_class

    a = onevision
    proc = processor_class(tf.LlavaOnevisionProcessor)(
        image_processor=a.image_processor, tokenizer=a.tokenizer, video_processor=object(),
        num_image_tokens=a.processor.num_image_tokens, vision_feature_select_strategy="full",
        chat_template=a.tokenizer.chat_template)
    ims = [scene(40, 20, seed=1), scene(30, 60, seed=2), scene(50, 50, seed=3)]
    ref = proc.apply_chat_template(messages("image", [{"image": i} for i in ims], PROMPT), add_generation_prompt=True,
                                   tokenize=True, return_dict=True, return_tensors="pt")
    assert ref["batch_num_images"].tolist() == [3]
    e = a.encode(ims, PROMPT)
    assert torch.equal(e.state.input_ids.cpu(), ref["input_ids"][0]) and e.n_visual == 3 * (G * G + 1)
    torch.testing.assert_close(a.prefill_logits(e), a.model(**ref).logits[0].float(), atol=1e-5, rtol=0)
