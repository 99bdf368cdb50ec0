"""InternVL adapter on a tiny random checkpoint built offline (tiny_internvl.py).

The keep-all anchor for one image (a wide one cut into 3 tiles + thumbnail, a square one into 2 x 2 +
thumbnail, a small one that stays one tile), several images and a video: the adapter's input ids are
the reference's, its logits are the model's own forward on those inputs and its greedy tokens
`model.generate`'s; a pruned run equals the model's forward with the dropped tokens masked out.
Inputs: images of every mode and extreme shapes against transformers' processor; video frames against
transformers' own `InternVLVideoProcessor.sample_frames` and a hand restatement of its pixels.
Geometry, [CLS] attention pooling, every registered method.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import mipruner
from mipruner.media import load_image, load_video, write_video
from mipruner.models.internvl.adapter import frame_indices

from ..no_grad import seeded_no_grad  # noqa: F401  (autouse: autograd off for this module)
from .anchor import assert_keep_all_is_the_unpruned_model, assert_pruned_equals_masked_full_sequence
from .boxes import best_overlap
from .tiny_internvl import IMAGE_SIZE, MAX_TILES, SEQ, save_tiny
from .tiny_llava import scene

PROMPT = "What colour is the square?"
H = int(SEQ ** 0.5)  # tokens per tile side


@pytest.fixture(scope="module")
def internvl(tmp_path_factory):
    return mipruner.load(save_tiny(str(tmp_path_factory.mktemp("internvl") / "iv")), device="cpu")


def _media(kind, video_path):
    return {"wide": scene(120, 40, square=(80, 10, 100, 30)), "square": scene(200, 200, square=(20, 20, 60, 60)),
            "small": scene(40, 40, seed=3), "images": [scene(40, 20, seed=1), scene(30, 60, seed=2)],
            "video": video_path}[kind]


KINDS = ["wide", "square", "small", "images", "video"]


@pytest.fixture(scope="module")
def encoded(internvl, video_path):
    return {k: internvl.encode(_media(k, video_path), PROMPT, need_attention=True) for k in KINDS}


def test_internvl_checkpoints_in_the_dropdown():
    from components.hosting.hub import SUGGESTED

    assert {"OpenGVLab/InternVL3-1B-hf", "OpenGVLab/InternVL3-8B-hf"} <= set(SUGGESTED)


def test_internvl_loads(internvl):
    assert internvl.family == "internvl"
    assert internvl.model.config.vision_config._attn_implementation == "eager"


# The contract (test_family_contract.py) runs the anchor on the wide image, several images and the clip;
# here, the square image and the small one (one tile, no thumbnail).
@pytest.mark.parametrize("kind", ["square", "small"])
def test_internvl_keep_all_is_the_unpruned_model(internvl, encoded, kind):
    assert_keep_all_is_the_unpruned_model(internvl, encoded[kind])


@pytest.mark.parametrize("kind", ["square", "small"])
def test_internvl_pruned_equals_masked_full_sequence(internvl, encoded, kind):
    assert_pruned_equals_masked_full_sequence(internvl, encoded[kind])


def test_internvl_token_counts_and_layout(internvl, encoded):
    ip = internvl.image_processor
    # wide 120x40: aspect 3 -> 3 x 1 tiles + thumbnail; square 200x200: aspect 1, area over half of
    # 4 tiles -> 2 x 2 + thumbnail; small 40x40 -> one tile, no thumbnail
    for kind, grids in (("wide", [(H, 3 * H), (H, H)]), ("square", [(2 * H, 2 * H), (H, H)]), ("small", [(H, H)])):
        e = encoded[kind]
        W, Hh = e.frames[0].size
        views = ip.get_number_of_image_patches(Hh, W, {"crop_to_patches": True})  # transformers' own count
        assert e.geometry.grids == grids and e.n_visual == views * SEQ, kind
        assert e.geometry.kind.count("thumbnail") == (SEQ if views > 1 else 0)
    assert encoded["wide"].geometry.kind[:3 * SEQ] == ["tile"] * (3 * SEQ)  # tiles first, thumbnail last
    images = encoded["images"]  # 40x20 -> 2 x 1 + thumbnail; 30x60 -> 1 x 2 + thumbnail
    assert images.geometry.grids == [(H, 2 * H), (H, H), (2 * H, H), (H, H)] and images.n_visual == 6 * SEQ
    assert images.geometry.frame.unique().tolist() == [0, 1, 2, 3] and len(images.frames) == 4
    video = encoded["video"]
    assert video.is_video and len(video.frames) == 8 and video.n_visual == 8 * SEQ
    assert set(video.geometry.kind) == {"frame"} and video.geometry.frame.tolist() == \
        torch.arange(8).repeat_interleave(SEQ).tolist()
    # the text around the tokens: <img> ... </img> per image, "Frame{i}: " per frame
    toks = internvl.tokenizer.convert_ids_to_tokens(video.state.input_ids.tolist())
    assert toks.count("<img>") == toks.count("</img>") == 8 and toks.count("frame") == 8
    assert encoded["images"].text_tokens.count("<img>") == 2 and encoded["images"].scoring_tokens[0] == "what"
    question = ["what", "colour", "is", "the", "square", "?"]  # scoring text: the question, not "frame 1 :"
    assert all(encoded[k].scoring_tokens == question for k in KINDS)


def test_internvl_pixel_shuffle_groups_2x2_patches(internvl):
    own = internvl.owner  # (h*h, 4) patch indices behind each token, from the model's pixel_shuffle
    g = internvl.g
    r, c = own // g, own % g
    assert own.shape == (SEQ, 4)
    i = torch.arange(SEQ) // H
    j = torch.arange(SEQ) % H
    assert torch.equal(r.min(1).values, 2 * i) and torch.equal(r.max(1).values, 2 * i + 1)
    assert torch.equal(c.min(1).values, 2 * j) and torch.equal(c.max(1).values, 2 * j + 1)


def test_internvl_boxes_cover_the_image_and_find_the_square(encoded):
    for kind, (W, Hh) in (("wide", (120, 40)), ("square", (200, 200))):
        g = encoded[kind].geometry
        for k in ("tile", "thumbnail"):
            sel = torch.tensor([x == k for x in g.kind])
            area = ((g.box[sel, 2] - g.box[sel, 0]) * (g.box[sel, 3] - g.box[sel, 1])).sum()
            assert abs(float(area) - W * Hh) < 1e-2, (kind, k)  # each view set tiles the image once
    e = encoded["wide"]
    g = e.geometry
    t = best_overlap(e, "tile", 0, (80, 10, 100, 30))
    assert 80 <= float(g.box[t, 0]) < 100 and int(g.col[t]) >= 2 * H  # in the third tile
    # a tile token's box: its 2 x 2 patches, a sixth of a 4 px patch pair in x (120 / (3 * 64) px per px)
    torch.testing.assert_close(g.box[0], torch.tensor([0.0, 0.0, 8 * 120 / 192, 8 * 40 / 64]))
    v = encoded["video"]
    i = best_overlap(v, "frame", 3, (12, 10, 26, 24))
    assert int(v.geometry.frame[i]) == 3 and v.geometry.box[i, 0] < 26 and v.geometry.box[i, 2] > 12


def test_internvl_cls_attention_pooled_to_tokens(internvl, encoded):
    own = internvl.owner
    for kind in KINDS:
        e = encoded[kind]
        assert e.has_cls and e.cls is None
        n = e.n_visual
        assert e.attention.shape == (n + 1, n + 1) and e.keys.shape[0] == n + 1
        raw = e.state.extra["attention_all"]  # (views, 1 + g*g, 1 + g*g)
        views = raw.shape[0]
        # row 0: each token's [CLS] attention = the sum over its 4 patches; per view 1 - A[cls, cls]
        want = raw[:, 0, 1:][:, own].sum(-1).flatten()  # (views * h*h,)
        torch.testing.assert_close(e.attention[0, 1:], want, atol=1e-6, rtol=0)
        per_view = e.attention[0, 1:].view(views, SEQ).sum(-1)
        torch.testing.assert_close(per_view, 1 - raw[:, 0, 0], atol=1e-5, rtol=0)
        # token block: rows sum to 1 minus the [CLS] share; 0 between views
        view_of = torch.arange(views).repeat_interleave(SEQ)
        other = view_of[:, None] != view_of[None, :]
        assert float(e.attention[1:, 1:][other].abs().sum()) == 0
        torch.testing.assert_close(e.attention[1:, 1:].sum(-1) + e.attention[1:, 0], torch.ones(n), atol=1e-5, rtol=0)
    # the attention pruner ranks by that [CLS] row
    e = encoded["wide"]
    sel = mipruner.select(internvl, e, "attention", 10)
    assert set(sel.keep.tolist()) == set(torch.topk(e.attention[0, 1:], 10).indices.tolist())


def test_internvl_video_frames_as_the_video_processor(internvl, video_path, encoded):
    from types import SimpleNamespace

    from transformers.video_utils import VideoMetadata

    from .official import installed

    sample = installed("models/internvl/video_processing_internvl.py", "InternVLVideoProcessor.sample_frames")
    e = encoded["video"]
    clip = load_video(video_path, 8)
    official = sample(SimpleNamespace(num_frames=None, initial_shift=True), VideoMetadata(total_num_frames=12, fps=4),
                      num_frames=8)
    assert load_video(video_path, sample=lambda t, f: official.tolist()).indices == official.tolist()
    ours = load_video(video_path, sample=lambda t, f: frame_indices(t, f, internvl.video, 8))
    assert ours.indices == official.tolist() == [0, 2, 3, 5, 6, 8, 9, 11]
    # pixels: resize to the processor's size with bicubic, rescale by 1/255, normalise
    s = internvl.video
    arr = np.stack([np.asarray(f.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC), np.float64) / 255
                    for f in ours.frames])
    want = (arr - np.array(s["image_mean"])) / np.array(s["image_std"])
    got = e.state.ref["pixel_values"].permute(0, 2, 3, 1).double().numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert clip.total_frames == 12


@pytest.mark.parametrize("cfg,k", [({"do_sample_frames": True, "num_frames": 4}, 4),
                                   ({"do_sample_frames": True, "fps": 2}, 6),  # 3 s at 4 fps
                                   ({"do_sample_frames": True, "num_frames": 20}, None),  # more than 12: every frame
                                   ({"do_sample_frames": True, "num_frames": 5, "initial_shift": False}, 5),
                                   ({"num_frames": 4}, 8)])  # sampling off: 8 by the same rule
def test_internvl_video_frames_follow_the_checkpoint(tmp_path, cfg, k):
    from types import SimpleNamespace

    from transformers.video_utils import VideoMetadata

    from .official import installed

    frames = [scene(32, 32, seed=i) for i in range(12)]
    path = write_video(frames, str(tmp_path / "c.mp4"), fps=4)
    a = mipruner.load(save_tiny(str(tmp_path / "iv"), video=cfg), device="cpu")
    e = a.encode(path, PROMPT)
    if k is None:
        assert len(e.frames) == 12
        return
    sample = installed("models/internvl/video_processing_internvl.py", "InternVLVideoProcessor.sample_frames")
    s = a.video
    on = s["do_sample_frames"]  # off: our 8 frames, by the official rule
    want = sample(SimpleNamespace(num_frames=None, initial_shift=True), VideoMetadata(total_num_frames=12, fps=4),
                  num_frames=s["num_frames"] if on else 8, fps=s["fps"] if on else None,
                  initial_shift=s["initial_shift"])
    assert len(e.frames) == k == len(want) and e.n_visual == k * SEQ
    got = load_video(path, sample=lambda t, f: frame_indices(t, f, s, 8))
    assert got.indices == want.tolist()


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA", "P", "CMYK"])
def test_internvl_image_modes_match_the_processor(internvl, mode):
    img = scene(50, 30, square=(10, 5, 30, 20)).convert(mode)
    e = internvl.encode(img, PROMPT)
    ref = internvl.processor(images=[load_image(img)], text=e.state.templated, return_tensors="pt")
    assert torch.equal(e.state.ref["pixel_values"], ref["pixel_values"])
    assert torch.equal(e.state.input_ids.cpu(), ref["input_ids"][0])


@pytest.mark.parametrize("size", [(300, 3), (3, 300), (700, 7), (1, 1)])
def test_internvl_extreme_shapes(internvl, size):
    e = internvl.encode(scene(*size), PROMPT)
    W, Hh = size
    g = e.geometry
    assert len(g) == e.n_visual and float(g.box[:, 2].max()) <= W + 1e-4 and float(g.box[:, 3].max()) <= Hh + 1e-4
    assert e.n_visual == internvl.image_processor.get_number_of_image_patches(Hh, W, {"crop_to_patches": True}) * SEQ
    assert e.n_visual <= (MAX_TILES + 1) * SEQ
    ref = e.state.ref
    torch.testing.assert_close(internvl.prefill_logits(e), internvl.model(**ref).logits[0].float(), atol=1e-5, rtol=0)


def test_internvl_errors(internvl, tmp_path):
    with pytest.raises(ValueError, match="prompt"):
        internvl.encode(scene(), "  ")
    e = internvl.encode(scene(), PROMPT)
    with pytest.raises(ValueError, match="keep"):
        internvl.prefill_logits(e, keep=torch.tensor([e.n_visual]))
    from mipruner.models.internvl.adapter import _processor

    tok = internvl.tokenizer.__class__.from_pretrained(internvl.name)
    tok.context_image_token = None
    with pytest.raises(ValueError, match="context_image_token"):
        _processor(internvl.image_processor, tok, {}, None)


@pytest.mark.parametrize("positions", ["compact", "original"])
@pytest.mark.parametrize("kind", ["wide", "images", "video"])
def test_internvl_batch_equals_one_by_one(internvl, encoded, kind, positions):
    """Several selections of one encoding as one left-padded batch give the one-by-one answers
    (batch_check's tie rule); the GPU path (bucketed lengths, static cache) keeps the keep-all answer."""
    from .batch_check import assert_selections_batch_equals_one_by_one

    assert_selections_batch_equals_one_by_one(internvl, encoded[kind], positions, min_share=0.5)


def official_processor(a, video_processor=None):
    """transformers' InternVLProcessor built by its own __init__ on the adapter's parts."""
    import transformers as tf

    from .official import processor_class

    return processor_class(tf.InternVLProcessor)(
        image_processor=a.image_processor, tokenizer=a.tokenizer, video_processor=video_processor or object(),
        image_seq_length=a.processor.image_seq_length, chat_template=a.tokenizer.chat_template)


def test_internvl_several_images_as_the_official_chat_template(internvl):
    """transformers' processor through `apply_chat_template` reads three images of one message as three
    <img> blocks, each tiled: the adapter gives the same ids, pixels and logits."""
    from .official import messages

    a = internvl
    ims = [scene(40, 20, seed=1), scene(30, 60, seed=2), scene(50, 50, seed=3)]
    ref = official_processor(a).apply_chat_template(messages("image", [{"image": i} for i in ims], PROMPT),
                                                    add_generation_prompt=True, tokenize=True, return_dict=True,
                                                    return_tensors="pt")
    e = a.encode(ims, PROMPT)
    assert torch.equal(e.state.input_ids.cpu(), ref["input_ids"][0]) and e.n_visual == 7 * SEQ
    assert torch.equal(e.state.ref["pixel_values"], ref["pixel_values"])
    torch.testing.assert_close(a.prefill_logits(e), a.model(**ref).logits[0].float(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("shift", [True, False, 1.5])
def test_internvl_frame_rule_equals_transformers_everywhere(shift):
    """`frame_indices` against the installed `InternVLVideoProcessor.sample_frames` for every clip length
    up to 40 and every count up to 12 it accepts (more frames asked than the clip has: every frame)."""
    from types import SimpleNamespace

    from transformers.video_utils import VideoMetadata

    from .official import installed

    sample = installed("models/internvl/video_processing_internvl.py", "InternVLVideoProcessor.sample_frames")
    compared = 0
    for total in range(1, 41):
        for k in range(1, 13):
            s = dict(do_sample_frames=True, num_frames=k, fps=None, initial_shift=shift)
            ours = frame_indices(total, 4.0, s, 8)
            try:
                want = sample(SimpleNamespace(num_frames=None, initial_shift=True),
                              VideoMetadata(total_num_frames=total, fps=4.0), num_frames=k, initial_shift=shift)
            except (ValueError, RuntimeError):  # k > total, or a shift past the clip: transformers refuses
                assert (k > total or shift is not True and shift >= total) and ours == list(range(total))
                continue
            assert ours == want.tolist(), (total, k)
            compared += 1
    assert compared == sum(min(12, t) for t in range(1, 41)) - (1 if shift == 1.5 else 0)
