"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL adapters on tiny checkpoints built offline (tiny_qwen.py).

For each family (the keep-all anchor and the masked prune on an image and a video file are the family
contract, tests/models/test_family_contract.py; (a) and (b) here run them on a 5-frame clip that the
temporal patch pads to 6):
  (a) keep-all: prefill logits IDENTICAL to `model(**inputs)`, greedy answer equal to
      `model.generate(**inputs, do_sample=False)` token for token;
  (b) keep 25%: the LLM input shrinks by exactly N_V - K, and the logits equal (1e-5) a run on
      the full sequence with the dropped tokens masked out of attention, with full M-RoPE positions;
  (c) negative controls: re-computed (compact) positions change the logits; for Qwen3-VL, deepstack
      features of the wrong rows, or none, change them too;
  (d) geometry: boxes tile the image; a red square maps to the expected token;
  (e) errors: empty prompt, keep out of range, prompt over the context.
`inputs` are the processor-equivalent tensors the adapter built (input_ids, mm_token_type_ids,
pixel values, grids): without torchvision no official processor can be built for these checkpoints
(their video processor imports it); the video path is checked against the PIL image processor.
"""
from __future__ import annotations

import pytest
import torch
from PIL import Image, ImageDraw

import mipruner
import mipruner.models
from mipruner.media import Video, write_video
from mipruner.pruners.selection import Selection

from . import tiny_qwen
from .anchor import assert_keep_all_is_the_unpruned_model, assert_pruned_equals_masked_full_sequence

FAMILIES = [f for f, fam in mipruner.models.FAMILIES.items() if fam.folder == "qwen"]
PROMPT = "What is red in the image?"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen")
    return {kind: mipruner.load(tiny_qwen.build(kind, str(root))) for kind in FAMILIES}


def scene(w=150, h=100, color="red"):
    im = Image.new("RGB", (w, h), (30, 60, 200))
    ImageDraw.Draw(im).rectangle([w // 4, h // 4, w // 2, h // 2], fill=color)
    return im


def video():
    frames = [scene(120, 90, c) for c in ["red", "green", "yellow", "white", "black"]]  # odd: padded to 6
    return Video(frames=frames, indices=[0, 3, 6, 9, 12], fps=6.0, total_frames=15)


@pytest.fixture(scope="module")
def encoded(adapters):
    out = {}
    for kind, ad in adapters.items():
        out[kind, "image"] = ad.encode(scene(), PROMPT)
        out[kind, "video"] = ad.encode(video(), PROMPT)
    return out


CASES = [(k, m) for k in FAMILIES for m in ("image", "video")]


# ---------------------------------------------------------------------------------------- (a), (b)
# The contract (test_family_contract.py) runs both on an image and a video file; here, the in-memory
# 5-frame clip that the temporal patch pads to 6 frames.
@pytest.mark.parametrize("kind", FAMILIES)
def test_keep_all_identical_to_transformers_odd_frames(adapters, encoded, kind):
    assert_keep_all_is_the_unpruned_model(adapters[kind], encoded[kind, "video"])


@pytest.mark.parametrize("kind", FAMILIES)
def test_pruned_equals_masked_full_sequence_odd_frames(adapters, encoded, kind):
    ad, enc = adapters[kind], encoded[kind, "video"]
    assert_pruned_equals_masked_full_sequence(ad, enc)
    keep = torch.randperm(enc.n_visual, generator=torch.Generator().manual_seed(0))[:max(1, enc.n_visual // 4)]
    ans = ad.generate(enc, keep=Selection.from_order(keep, torch.zeros(enc.n_visual)), max_new_tokens=3)
    assert ans.visual_tokens == keep.numel() and 1 <= len(ans.token_ids) <= 3


def test_merged_tokens_are_fed_in_keep_order(adapters, encoded):
    ad, enc = adapters["qwen2_vl"], encoded["qwen2_vl", "image"]
    keep = torch.tensor([1, 5, 7])
    sel = Selection(keep=keep, order=keep, scores=torch.zeros(enc.n_visual), tokens=enc.visual[keep] * 0.5)
    inputs = ad._llm_inputs(enc, sel)
    assert torch.equal(inputs["mm_encoder_outputs"]["image"].pooler_output[0], enc.visual[keep] * 0.5)
    assert not torch.equal(ad.prefill_logits(enc, sel), ad.prefill_logits(enc, keep))


# ---------------------------------------------------------------------------------------- (c)
@pytest.mark.parametrize("kind,media", CASES)
def test_compact_positions_change_logits(adapters, encoded, kind, media):
    ad, enc = adapters[kind], encoded[kind, media]
    keep = torch.arange(0, enc.n_visual, 4)
    inputs = ad._llm_inputs(enc, keep)
    L = inputs["input_ids"].shape[1]
    with torch.no_grad():
        good = ad.model(**inputs).logits[0]
        inputs["position_ids"] = torch.arange(L).view(1, 1, L).expand(3, 1, L)  # re-computed, compact
        bad = ad.model(**inputs).logits[0]
    assert (good - bad).abs().max() > 1e-3


@pytest.mark.parametrize("media", ["image", "video"])
def test_qwen3_deepstack_must_be_pruned_with_the_same_rows(adapters, encoded, media):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures
    ad, enc = adapters["qwen3_vl"], encoded["qwen3_vl", media]
    keep = torch.arange(1, enc.n_visual, 4)
    inputs = ad._llm_inputs(enc, keep)
    out = inputs["mm_encoder_outputs"][media]
    assert len(out.deepstack_features) == len(ad.config.vision_config.deepstack_visual_indexes)
    for f, full in zip(out.deepstack_features, enc.state.deepstack):
        assert torch.equal(f[0], full[keep])
    with torch.no_grad():
        good = ad.model(**inputs).logits[0]
        wrong = [(f[: keep.numel()],) for f in enc.state.deepstack]  # not the kept rows
        inputs["mm_encoder_outputs"] = {media: BaseModelOutputWithDeepstackFeatures(
            pooler_output=out.pooler_output, deepstack_features=wrong)}
        bad_rows = ad.model(**inputs).logits[0]
        inputs["mm_encoder_outputs"] = {media: BaseModelOutputWithDeepstackFeatures(
            pooler_output=out.pooler_output, deepstack_features=[])}
        dropped = ad.model(**inputs).logits[0]
    assert (good - bad_rows).abs().max() > 1e-3
    assert (good - dropped).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------- (d)
@pytest.mark.parametrize("kind,media", CASES)
def test_boxes_tile_each_frame(encoded, kind, media):
    enc = encoded[kind, media]
    g = enc.geometry
    assert len(g) == enc.n_visual and g.box.shape == (enc.n_visual, 4)
    assert len(enc.frames) == len(g.grids) == int(g.frame.max()) + 1
    for t, ((rows, cols), (w, h)) in enumerate(zip(g.grids, g.sizes)):
        sel = g.frame == t
        box = g.box[sel]
        assert int(sel.sum()) == rows * cols
        assert torch.allclose(box[:, 2:] - box[:, :2] > 0, torch.ones_like(box[:, 2:], dtype=torch.bool))
        area = ((box[:, 2] - box[:, 0]) * (box[:, 3] - box[:, 1])).sum()
        assert area == pytest.approx(w * h, rel=1e-5)
        assert float(box[:, 0].min()) == 0 and float(box[:, 1].min()) == 0
        assert float(box[:, 2].max()) == pytest.approx(w) and float(box[:, 3].max()) == pytest.approx(h)
        # row-major order, as the merger emits tokens
        assert torch.equal(g.row[sel] * cols + g.col[sel], torch.arange(rows * cols))
    if media == "video":
        assert enc.is_video and enc.state.frame_groups[-1] == [4, 4]  # 5 frames, padded to 6 with the last


@pytest.mark.parametrize("kind", FAMILIES)
def test_red_square_maps_to_expected_token(adapters, kind):
    ad = adapters[kind]
    # 336 x 224 is resized to 196 x 112 (7 x 4 tokens of 28 px): x scale 336/196, y scale 2
    im = Image.new("RGB", (336, 224), "white")
    ImageDraw.Draw(im).rectangle([240, 112, 287, 167], fill=(255, 0, 0))
    enc = ad.encode(im, PROMPT)
    g = enc.geometry
    assert g.grids == [(4, 7)]
    want = 2 * 7 + 5
    assert torch.allclose(g.box[want], torch.tensor([240.0, 112.0, 288.0, 168.0]), atol=1e-4)
    # the token's own pixels are the red ones: patches in merge-group order, (C, T, p, p) each
    px = enc.state.vision_inputs["pixel_values"]
    m2, p = ad.merge ** 2, ad.patch
    px = px.view(enc.n_visual, m2, 3, ad.temporal, p, p)
    redness = (px[:, :, 0] - px[:, :, 1]).mean(dim=(1, 2, 3, 4))  # (N_V,)
    assert int(redness.argmax()) == want
    assert float(redness[want]) > 2.0 and float(redness.sort().values[-2]) < 1.0


# ---------------------------------------------------------------------------------------- (e)
@pytest.mark.parametrize("kind", FAMILIES)
def test_errors(adapters, encoded, kind):
    ad, enc = adapters[kind], encoded[kind, "image"]
    with pytest.raises(ValueError, match="empty"):
        ad.encode(scene(), "   ")
    with pytest.raises(ValueError, match="keep"):
        ad.prefill_logits(enc, keep=[0, enc.n_visual])
    with pytest.raises(ValueError, match="keep"):
        ad.generate(enc, keep=[-1], max_new_tokens=2)
    with pytest.raises(ValueError, match="too long"):
        ad.encode(scene(), "red " * ad.config.text_config.max_position_embeddings)
    with pytest.raises(ValueError, match="context"):
        ad.generate(enc, max_new_tokens=ad.config.text_config.max_position_embeddings)
    with pytest.raises(ValueError, match="greedy"):
        ad.generate(enc, do_sample=True)


# ---------------------------------------------------------------------------------------- video path
def test_video_pixels_match_image_processor_per_frame(adapters):
    """Our torchvision-free video path == the PIL image processor applied to each sampled frame.

    Valid equivalence for Qwen2-VL: both resize with PIL to the same smart-resize target (the
    video processor's min/max pixels) and normalise alike; the image processor repeats a frame T
    times along the temporal axis, the video layout puts T consecutive frames there instead.
    """
    ad = adapters["qwen2_vl"]
    v = video()
    pixels, grid, (rh, rw) = ad._video_pixels(v.frames)
    t, p, m = ad.temporal, ad.patch, ad.merge
    grid_t, gh, gw = grid[0].tolist()
    assert grid_t == 3 and (gh * p, gw * p) == (rh, rw)
    vid = pixels.view(grid_t, gh // m, gw // m, m, m, 3, t, p, p)
    vc = ad.video_config
    frames = v.frames + [v.frames[-1]]
    for i, frame in enumerate(frames):
        ref = ad.image_processor(images=frame, size=vc["size"], return_tensors="pt")
        assert ref["image_grid_thw"].tolist() == [[1, gh, gw]]
        ref = ref["pixel_values"].view(gh // m, gw // m, m, m, 3, t, p, p)[..., 0, :, :]
        assert torch.equal(vid[i // t, ..., i % t, :, :], ref)
    # a static video is exactly the image tiled grid_t times
    still, _, _ = ad._video_pixels([v.frames[0]] * 4)
    img = ad.image_processor(images=v.frames[0], size=vc["size"], return_tensors="pt")
    assert torch.equal(still, img["pixel_values"].repeat(2, 1))


def test_video_file_frame_count_and_qwen3_timestamps(adapters, tmp_path):
    frames = [scene(112, 84, c) for c in ["red", "green", "blue", "white"] * 3]  # 12 frames at 4 fps = 3 s
    path = write_video(frames, str(tmp_path / "clip.mp4"), fps=4)
    enc = adapters["qwen2_vl"].encode(path, PROMPT)
    # Qwen2-VL rule: 3 s * 2 fps = 6 frames (within min 4 / max 8) -> 3 token-frames
    assert len(enc.state.sampled_frames) == 6 and len(enc.geometry.grids) == 3
    enc3 = adapters["qwen3_vl"].encode(path, PROMPT)
    assert len(enc3.state.sampled_frames) == 6
    text = enc3.state.templated
    assert text.count(" seconds>") == len(enc3.geometry.grids) == 3
    assert enc3.visual.shape[0] == enc3.n_visual == len(enc3.state.visual_positions)


# ---------------------------------------------------------------------------------------- attention
def recompute_block(ad, enc, media: str, block: int, **capture):
    """Run the tower again with `_attention_capture` on ViT `block` (per head kept) and check that its
    recomputed probabilities reproduce the block's real attention output, proj(P @ V); returns (the
    block's attention module, the capture's store)."""
    vision = dict(enc.state.vision_inputs)
    module = ad.model.model.visual.blocks[block].attn
    seen = {}
    handle = module.register_forward_hook(lambda mod, a, out: seen.setdefault("out", out))
    store = {"keep_heads": True}
    try:
        with torch.no_grad(), ad._attention_capture(vision, store, enabled=True, **capture):
            if media == "video":
                ad.model.get_video_features(vision["pixel_values_videos"], vision["video_grid_thw"])
            else:
                ad.model.get_image_features(vision["pixel_values"], vision["image_grid_thw"])
    finally:
        handle.remove()
    probs, values = store["probs"], store["values"].float().transpose(0, 1)  # (H, P, P), (H, P, hd)
    out = (probs @ values).transpose(0, 1).reshape(probs.shape[1], -1)
    with torch.no_grad():
        torch.testing.assert_close(module.proj(out), seen["out"], atol=1e-5, rtol=1e-4)
    return module, store


@pytest.mark.parametrize("kind,media", CASES)
def test_vision_attention(adapters, kind, media):
    """The recomputed probabilities reproduce the block's real attention output: proj(P @ V)."""
    ad = adapters[kind]
    enc = ad.encode(scene() if media == "image" else video(), PROMPT, need_attention=True)
    n = enc.n_visual
    assert enc.attention.shape == (n, n) and enc.keys.shape[0] == n and not enc.has_cls
    assert torch.allclose(enc.attention.sum(-1), torch.ones(n), atol=1e-5)
    assert bool((enc.attention >= 0).all())
    # recompute the block output from the captured probabilities
    module, store = recompute_block(ad, enc, media, ad._attention_block())
    assert not module._forward_pre_hooks and not module._forward_hooks  # hooks removed
    if media == "video":  # no attention across token-frames
        per = n // len(enc.geometry.grids)
        assert float(enc.attention[:per, per:].abs().max()) == 0.0
    assert torch.equal(store["attention"], enc.attention)
    for name in ("attention", "visionzip", "vispruner", "mi_attention"):  # the pruners take it as is
        sel = mipruner.prune(name, visual=enc.visual, text=enc.scoring_text, budget=0.25,
                             attention=enc.attention, keys=enc.keys)
        assert sel.budget == round(0.25 * n)


@pytest.mark.parametrize("kind,media", CASES)
def test_every_block_the_methods_ask_for_is_recomputed_exactly(adapters, kind, media):
    """Each ViT block a method may ask for (`mipruner.Signals`), captured together in one pass: its
    recomputed per-head probabilities reproduce that block's real attention output, proj(P @ V), and the
    per-head maps pooled to tokens average to the head-mean map the encoding holds for it."""
    ad = adapters[kind]
    depth = len(ad.model.model.visual.blocks)
    enc = ad.encode(scene() if media == "image" else video(), PROMPT,
                    signals=mipruner.Signals(heads=frozenset(range(depth))))
    for block in sorted({ad._attention_block(b) for b in range(depth)}):
        _, store = recompute_block(ad, enc, media, block, blocks={block: True})
        for b in range(depth):  # every block asked that this block gives
            if ad._attention_block(b) == block:
                got = enc.blocks[b]
                assert got["block"] == block and torch.equal(got["attention"], store["blocks"][block]["attention"])
                torch.testing.assert_close(got["attention_heads"].mean(0), got["attention"], atol=1e-6, rtol=1e-5)


def test_qwen2_5_video_temporal_positions(encoded, adapters):
    """second_per_grid_ts = T / sampled fps (5 of 15 frames at 6 fps -> 2 fps -> 1 s per patch);
    temporal M-RoPE ids then step by tokens_per_second * 1 s between token-frames."""
    enc = encoded["qwen2_5_vl", "video"]
    assert enc.state.rope_kwargs["second_per_grid_ts"].tolist() == [1.0]
    pos = enc.state.positions[:, 0, enc.state.visual_positions]  # (3, N_V)
    per = enc.n_visual // len(enc.geometry.grids)
    step = adapters["qwen2_5_vl"].config.vision_config.tokens_per_second
    assert (pos[0, per] - pos[0, 0]).item() == step and (pos[0, 2 * per] - pos[0, per]).item() == step
    # Qwen2-VL: temporal ids step by 1
    enc2 = encoded["qwen2_vl", "video"]
    pos2 = enc2.state.positions[:, 0, enc2.state.visual_positions]
    assert (pos2[0, per] - pos2[0, 0]).item() == 1


def test_attention_block_exists_when_the_config_lists_blocks_past_the_depth(tmp_path):
    """Qwen2.5-VL's tester config keeps the default full-attention blocks [7, 15, 23, 31] on a 2-block
    tower: the captured block is one the tower has (none listed: the target block, its windows)."""
    from . import tester_models

    ad = mipruner.load(tester_models.build("qwen2_5_vl", str(tmp_path)))
    depth = len(ad.model.model.visual.blocks)
    assert min(ad.config.vision_config.fullatt_block_indexes) >= depth
    assert 0 <= ad._attention_block() < depth
    enc = ad.encode(scene(), PROMPT, need_attention=True)
    assert enc.attention.shape == (enc.n_visual, enc.n_visual) and bool(torch.isfinite(enc.attention).all())
