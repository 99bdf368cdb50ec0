"""Families x inputs: with every visual token kept, mipruner reads what transformers' own pipeline reads.

For each family (checkpoints from transformers' tester configs, tester_models.py) and each input
(transparent PNG as a path and in memory, palette with a transparent entry, greyscale, CMYK,
16-bit, 1000x20, 20x1000, a 333x517 photograph, a 15-frame video, a 1-frame video):
  same input ids, same pixels, logits within 1e-5, same greedy tokens as
  `processor.apply_chat_template(..., tokenize=True)` -> `model(**inputs)` / `model.generate(**inputs)`.
The official processors run unchanged for images. Video processors need torchvision, which CI
lacks: their place is taken by transformers' own functions composed as they compose them
(`official.VideoFunctions`: `video_utils.load_video(backend="pyav")`, the official `sample_frames`,
resize rule and `patchify`), with PIL resizing where the official processor uses torchvision.
Where the official pipeline cannot read a video (fewer frames than 8 for Video-LLaVA's 8-frame
sampler; Qwen2.5-VL's fps rule on a 1-frame clip), the test checks that it fails and compares with
the official pipeline reading every frame (do_sample_frames off), which is what the adapters do;
Qwen3-VL refuses a 1-frame video like the official processor, with a MediaError.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

import mipruner
from mipruner.media import MediaError, write_video

from . import tester_models
from .official import VideoFunctions, messages, processor_class

PROMPT = "What is red in the image?"
IMAGES = ["rgba_path", "rgba_memory", "palette_memory", "grey_path", "cmyk_path", "16bit_path", "wide_1000x20",
          "tall_20x1000", "photo_333x517"]
VIDEOS = ["video_15_frames", "video_1_frame"]
NEW_TOKENS = 4


def photo(w: int, h: int, seed: int = 0) -> np.ndarray:
    """A photograph-like RGB array: smooth gradients, a few shapes, sensor noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w] / max(w, h)
    arr = np.stack([180 * x + 40, 120 * y + 60 * x, 200 - 150 * y], -1)
    im = Image.fromarray(np.clip(arr + rng.normal(0, 6, arr.shape), 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(im)
    d.ellipse([w // 5, h // 4, w // 2, h // 2], fill=(220, 30, 30))
    d.rectangle([w // 2, h // 2, 4 * w // 5, 4 * h // 5], fill=(30, 160, 60))
    return np.asarray(im)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    rgb = photo(120, 90)
    alpha = np.full(rgb.shape[:2], 255, np.uint8)
    alpha[:, :40] = 0  # fully transparent strip whose hidden colour is red
    alpha[:, 40:80] = 128
    hidden = rgb.copy()
    hidden[:, :40] = (255, 0, 0)
    rgba = Image.fromarray(np.dstack([hidden, alpha]), "RGBA")
    rgba.save(d / "rgba.png")
    pal = Image.fromarray(rgb).quantize(32)
    pal.info["transparency"] = int(np.asarray(pal)[0, 0])
    Image.fromarray(rgb[..., 0]).save(d / "grey.png")
    Image.fromarray(rgb).convert("CMYK").save(d / "cmyk.jpg")
    Image.fromarray(rgb[..., 1].astype(np.uint16) * 257).save(d / "16bit.png")
    Image.fromarray(photo(333, 517, seed=1)).save(d / "photo.jpg", quality=90)
    clip = [Image.fromarray(photo(112, 84, seed=10 + i)) for i in range(15)]
    out = {"rgba_path": str(d / "rgba.png"), "rgba_memory": rgba, "palette_memory": pal,
           "grey_path": str(d / "grey.png"), "cmyk_path": str(d / "cmyk.jpg"), "16bit_path": str(d / "16bit.png"),
           "wide_1000x20": Image.fromarray(photo(1000, 20, seed=2)),
           "tall_20x1000": Image.fromarray(photo(20, 1000, seed=3)), "photo_333x517": str(d / "photo.jpg"),
           "video_15_frames": write_video(clip, str(d / "odd.mp4"), fps=6),
           "video_1_frame": write_video(clip[:1], str(d / "one.mp4"), fps=6)}
    return out


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tester"))
    return {fam: official_setup(fam, mipruner.load(tester_models.build(fam, root))) for fam in tester_models.FAMILIES}


def official_setup(fam: str, ad):
    """(adapter, official processor) for a family."""
    import transformers as tf

    if fam in ("llava", "llava_next"):
        return ad, tf.AutoProcessor.from_pretrained(ad.name)
    tok = ad.tokenizer
    if fam == "video_llava":
        vp = VideoFunctions("clip", {}, ad.image_processor, num_frames=ad.default_frames)
        proc = processor_class(tf.VideoLlavaProcessor)(
            image_processor=ad.image_processor, video_processor=vp, tokenizer=tok,
            patch_size=ad.config.vision_config.patch_size, vision_feature_select_strategy="default",
            num_additional_image_tokens=1, chat_template=tok.chat_template)
        return ad, proc
    if fam == "llava_onevision":
        vp = VideoFunctions("onevision", ad.video, num_frames=ad.default_frames)
        proc = processor_class(tf.LlavaOnevisionProcessor)(
            image_processor=ad.image_processor, tokenizer=tok, video_processor=vp,
            num_image_tokens=ad.processor.num_image_tokens, vision_feature_select_strategy="full",
            chat_template=tok.chat_template)
        return ad, proc
    if fam == "internvl":
        vp = VideoFunctions("internvl", ad.video, num_frames=ad.default_frames)
        proc = processor_class(tf.InternVLProcessor)(
            image_processor=ad.image_processor, tokenizer=tok, video_processor=vp,
            image_seq_length=ad.processor.image_seq_length, chat_template=tok.chat_template)
        return ad, proc
    cls = {"qwen2_vl": tf.Qwen2VLProcessor, "qwen2_5_vl": tf.Qwen2_5_VLProcessor, "qwen3_vl": tf.Qwen3VLProcessor}[fam]
    vp = VideoFunctions("qwen3" if fam == "qwen3_vl" else "qwen2", ad.video_config)
    proc = processor_class(cls)(image_processor=ad.image_processor, tokenizer=tok, video_processor=vp,
                                chat_template=tok.chat_template)
    return ad, proc


def official_inputs(fam, proc, name, media):
    """The official pipeline's model inputs, and how it read the video (None for images)."""
    kw = dict(add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt")
    if name not in VIDEOS:
        item = {"path": media} if isinstance(media, str) else {"image": media}
        return proc.apply_chat_template(messages("image", [item], PROMPT), **kw), None
    if fam == "llava":  # no video processor: 8 frames by transformers' default rule, each an image
        from transformers.video_utils import load_video

        try:
            frames, meta = load_video(media, num_frames=8, backend="pyav")
            how = "sampled"
        except ValueError:  # fewer than 8 frames: transformers refuses, the adapter reads them all
            frames, meta = load_video(media, backend="pyav")
            how = "every frame"
        items = [{"image": Image.fromarray(f)} for f in frames]
        return proc.apply_chat_template(messages("image", items, PROMPT), **kw), (how, list(meta.frames_indices))
    vp, msgs = proc.video_processor, messages("video", [{"path": media}], PROMPT)
    try:
        try:
            out, how = proc.apply_chat_template(msgs, **kw), "sampled"
        except (ValueError, ZeroDivisionError):  # the official sampler cannot take this clip
            vp.sample = False
            out, how = proc.apply_chat_template(msgs, **kw), "every frame"
        return out, (how, vp.last_indices)
    finally:
        vp.sample = True


def model_inputs(inputs):
    return {k: v for k, v in inputs.items() if k != "video_metadata"}


CASES = [(f, i) for f in tester_models.FAMILIES for i in IMAGES + VIDEOS]


@pytest.mark.parametrize("fam,name", CASES, ids=[f"{f}-{i}" for f, i in CASES])
def test_same_as_transformers(families, inputs, fam, name):
    ad, proc = families[fam]
    media = inputs[name]
    if fam == "llava_next" and name in VIDEOS:  # no video path in LLaVA-NeXT (official or ours)
        with pytest.raises(MediaError, match="takes one image"):
            ad.encode(media, PROMPT)
        return
    if fam == "qwen3_vl" and name == "video_1_frame":
        with pytest.raises(ValueError, match="temporal_factor"):  # the official processor refuses ...
            proc.video_processor.resize_target(1, 84, 112)
        with pytest.raises(MediaError, match="at least 2 frames"):  # ... and so do we, plainly
            ad.encode(media, PROMPT)
        return
    ref, video = official_inputs(fam, proc, name, media)
    if video is not None:
        every = ("llava", "video_llava", "llava_onevision", "internvl", "qwen2_5_vl")
        expect = "every frame" if name == "video_1_frame" and fam in every else "sampled"
        assert video[0] == expect, video
    with torch.no_grad():
        enc = ad.encode(media, PROMPT)
        ids = enc.state.input_ids.reshape(1, -1).cpu()
        assert torch.equal(ids, ref["input_ids"])
        if fam.startswith("qwen") and video is not None:
            assert enc.state.frame_indices == video[1]
        assert_same_pixels(fam, enc, ref, video is not None)
        ref_logits = ad.model(**model_inputs(ref)).logits[0].float()
        torch.testing.assert_close(ad.prefill_logits(enc), ref_logits, atol=1e-5, rtol=0)
        pad = ad.tokenizer.pad_token_id
        gen = ad.model.generate(**model_inputs(ref), do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=pad)
        assert ad.generate(enc, max_new_tokens=NEW_TOKENS).token_ids == gen[0, ids.shape[1]:].tolist()


def assert_same_pixels(fam, enc, ref, is_video):
    if fam.startswith("qwen"):
        key = "pixel_values_videos" if is_video else "pixel_values"
        ours = enc.state.vision_inputs[key]
        # videos: normalised in another order than the image processor does it (float rounding)
        torch.testing.assert_close(ours, ref[key], atol=1e-6 if is_video else 0, rtol=0)
        return
    if fam in ("llava_onevision", "internvl") and is_video:  # the same steps, float rounding of rescale/normalise aside
        key = "pixel_values" if fam == "internvl" else "pixel_values_videos"  # InternVL: frames as images
        torch.testing.assert_close(enc.state.ref[key].float(), ref[key].float(), atol=1e-5, rtol=0)
        return
    key = "pixel_values_videos" if fam == "video_llava" and is_video else "pixel_values"
    assert torch.equal(enc.state.ref[key].float(), ref[key if key in ref else image_key(ref)].float())


def image_key(inputs) -> str:
    """VideoLlavaProcessor names image pixels "pixel_values_images"."""
    return "pixel_values" if "pixel_values" in inputs else "pixel_values_images"


def test_transparency_changes_the_pixels(families, inputs):
    """Negative control: the official pipeline reads the RGBA file and the RGBA image differently
    (a path drops transparency, an image is composited onto white), so the table tells them apart."""
    for fam, (ad, proc) in families.items():
        a, _ = official_inputs(fam, proc, "rgba_path", inputs["rgba_path"])
        b, _ = official_inputs(fam, proc, "rgba_memory", inputs["rgba_memory"])
        assert not torch.equal(a[image_key(a)], b[image_key(b)]), fam


@pytest.mark.parametrize("fam", tester_models.FAMILIES)
@pytest.mark.parametrize("size", [(1000, 3), (3, 1000), (700, 7)])
def test_more_extreme_shapes(families, fam, size):
    """Aspect ratios past the table's: the same ids as transformers, or the same refusal (Qwen's
    resize refuses an aspect ratio over 200); LLaVA-NeXT's geometry stays inside the image."""
    ad, proc = families[fam]
    image = Image.fromarray(photo(*size, seed=4))
    try:
        ref, _ = official_inputs(fam, proc, "image", image)
    except ValueError as e:
        assert fam.startswith("qwen") and "aspect ratio" in str(e)
        with pytest.raises(ValueError, match="aspect ratio"):
            ad.encode(image, PROMPT)
        return
    with torch.no_grad():
        enc = ad.encode(image, PROMPT)
    assert torch.equal(enc.state.input_ids.reshape(1, -1).cpu(), ref["input_ids"])
    g, (w, h) = enc.geometry, size
    assert len(g) == enc.n_visual and bool(torch.isfinite(g.box).all())
    assert bool((g.box[:, 0] >= 0).all() & (g.box[:, 1] >= 0).all() & (g.box[:, 2] <= w).all() & (g.box[:, 3] <= h).all())
    if fam == "llava_next":  # one newline token per row of the unpadded canvas
        assert g.kind.count("newline") == g.grids[1][0]


def test_internvl_and_onevision_processors_are_built_by_their_own_constructor(families):
    """The adapters' processors are transformers' classes, built by their `__init__` (no `object.__new__`): the
    attributes that constructor derives from the tokenizer are there and equal the official processor's."""
    import transformers as tf

    for fam, cls, names in (("internvl", tf.InternVLProcessor, ("image_seq_length", "image_token_id",
                                                                "start_image_token_id", "end_image_token_id")),
                            ("llava_onevision", tf.LlavaOnevisionProcessor, ("num_image_tokens", "image_token_id",
                                                                             "video_token_id", "vision_aspect_ratio"))):
        ad, official = families[fam]
        assert isinstance(ad.processor, cls) and type(ad.processor).__init__ is cls.__init__
        assert {n: getattr(ad.processor, n) for n in names} == {n: getattr(official, n) for n in names}
        assert ad.processor.get_attributes() == ["image_processor", "tokenizer", "video_processor"]
