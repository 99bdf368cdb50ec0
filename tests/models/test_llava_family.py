"""LLaVA-1.5, LLaVA-NeXT and Video-LLaVA adapters on tiny random checkpoints built offline.

What is particular to the LLaVA line (the keep-all anchor and the masked prune of every family are
tests/models/test_family_contract.py): merged tokens spliced in keep order, geometry tiles the image and
finds a red square, LLaVA-NeXT's views and unpadding, vision attention capture, frames that fit the
context; errors are plain ValueErrors.
"""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.media import MediaError
from mipruner.pruners import Selection

from ..no_grad import seeded_no_grad  # noqa: F401  (autouse: autograd off for this module)
from .tiny_llava import IMAGE_SIZE, MAX_POSITIONS, PATCH, save_tiny, scene

PROMPT = "What colour is the square?"
RED = (28, 14, 42, 28)  # x0, y0, x1, y1: token row 1, col 2 of the 4 x 4 grid of a 56 px image


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_llava")
    return {fam: save_tiny(fam, str(root / fam)) for fam in ("llava", "llava_next", "video_llava")}


@pytest.fixture(scope="module")
def adapters(tiny_dir):
    return {fam: mipruner.load(path, device="cpu") for fam, path in tiny_dir.items()}


CASES = [("llava", "image"), ("llava", "video"), ("llava_next", "image"), ("video_llava", "image"),
         ("video_llava", "video")]


@pytest.fixture(scope="module")
def encoded(adapters, video_path):
    out = {}
    for fam, kind in CASES:
        media = video_path if kind == "video" else scene(112, 56, square=(70, 14, 84, 28))
        out[fam, kind] = adapters[fam].encode(media, PROMPT)
    return out


def _ids(fam, kind):
    return f"{fam}-{kind}"


@pytest.mark.parametrize("fam,kind", CASES, ids=[_ids(*c) for c in CASES])
def test_loads_the_right_adapter(adapters, fam, kind):
    assert adapters[fam].family == fam
    assert adapters[fam].model.config.vision_config._attn_implementation == "eager"
    assert adapters[fam].model.config.text_config._attn_implementation == "sdpa"


def test_merged_tokens_are_spliced_in_keep_order(adapters, encoded):
    a, e = adapters["llava"], encoded["llava", "image"]
    keep = torch.tensor([9, 2, 5])
    # VisionZip-style Selection: `tokens` rows follow `keep`; here they are the original rows
    sel = Selection(keep=keep.sort().values, order=keep, scores=torch.zeros(e.n_visual),
                    tokens=e.visual[keep.sort().values])
    torch.testing.assert_close(a.prefill_logits(e, keep=sel), a.prefill_logits(e, keep=keep), atol=0, rtol=0)
    bad = Selection(keep=keep.sort().values, order=keep, scores=torch.zeros(e.n_visual),
                    tokens=torch.zeros(2, e.visual.shape[1]))
    with pytest.raises(ValueError, match="tokens"):
        a.prefill_logits(e, keep=bad)


# ---------------------------------------------------------------------------------------------
# geometry


def _coverage(boxes: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """(H, W) count of boxes covering each pixel centre."""
    ys, xs = torch.meshgrid(torch.arange(height) + 0.5, torch.arange(width) + 0.5, indexing="ij")
    cov = torch.zeros(height, width, dtype=torch.long)
    for x0, y0, x1, y1 in boxes.tolist():
        cov += ((xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)).long()
    return cov


@pytest.mark.parametrize("fam", ["llava", "video_llava"])
def test_patch_boxes_tile_a_square_image_and_find_the_red_square(adapters, fam):
    a = adapters[fam]
    e = a.encode(scene(2 * IMAGE_SIZE, 2 * IMAGE_SIZE, square=tuple(2 * v for v in RED)), PROMPT)
    geo = e.geometry
    assert len(geo) == e.n_visual == (IMAGE_SIZE // PATCH) ** 2 and set(geo.kind) == {"patch"}
    assert torch.equal(_coverage(geo.box, 112, 112), torch.ones(112, 112, dtype=torch.long))
    hit = [i for i, b in enumerate(geo.box.tolist()) if b[0] < 84 and b[2] > 56 and b[1] < 56 and b[3] > 28]
    assert hit == [int(torch.nonzero((geo.row == 1) & (geo.col == 2)))]
    assert geo.grids == [(4, 4)] and geo.sizes == [(112, 112)]


def test_center_crop_and_pad_geometry(tmp_path):
    # 112 x 56: shortest edge 56 (no resize), centre crop 56 drops 28 px each side
    wide = scene(112, 56, square=(70, 14, 84, 28))
    a = mipruner.load(save_tiny("llava", str(tmp_path / "crop")), device="cpu")
    geo = a.encode(wide, PROMPT).geometry
    assert geo.box[:, 0].min() == 28 and geo.box[:, 2].max() == 84
    i = int(torch.nonzero((geo.box[:, 0] == 70) & (geo.box[:, 1] == 14)))
    assert (geo.row[i].item(), geo.col[i].item()) == (1, 3)
    # pad-to-square: 112 x 56 padded to 112 x 112 (28 px above and below), resized to 56
    p = mipruner.load(save_tiny("llava", str(tmp_path / "pad"), do_pad=True), device="cpu")
    geo = p.encode(wide, PROMPT).geometry
    area = (geo.box[:, 2] - geo.box[:, 0]) * (geo.box[:, 3] - geo.box[:, 1])
    assert torch.equal(_coverage(geo.box, 112, 56), torch.ones(56, 112, dtype=torch.long))
    assert int((area == 0).sum()) == 8  # rows 0 and 3 of the grid lie in the padding
    red = (geo.box[:, 0] < 84) & (geo.box[:, 2] > 70) & (geo.box[:, 1] < 28) & (geo.box[:, 3] > 14)
    i = int(torch.nonzero(red))  # the one token that holds the red square: (56, 0, 84, 28)
    assert (geo.row[i].item(), geo.col[i].item()) == (1, 2) and geo.box[i].tolist() == [56, 0, 84, 28]


def test_llava_next_views_tiles_and_newlines(adapters, encoded):
    e = encoded["llava_next", "image"]  # 112 x 56 -> best resolution 56 x 112: 1 x 2 tiles
    geo = e.geometry
    g = IMAGE_SIZE // PATCH
    assert geo.kind[: g * g] == ["base"] * g * g
    assert geo.grids == [(g, g), (g, 2 * g)] and len(e.frames) == 2
    assert [geo.kind.count(k) for k in ("base", "tile", "newline")] == [g * g, 2 * g * g, g]
    assert e.n_visual == g * g + 2 * g * g + g
    base = torch.tensor([k == "base" for k in geo.kind])
    tile = torch.tensor([k == "tile" for k in geo.kind])
    newline = ~base & ~tile
    # both views tile the whole 112 x 56 image
    for sel in (base, tile):
        assert torch.equal(_coverage(geo.box[sel], 112, 56), torch.ones(56, 112, dtype=torch.long))
    # LLM order: every canvas row is followed by its newline token, whose box spans the row
    nl_idx = torch.nonzero(newline).flatten()
    assert torch.equal(nl_idx, g * g + torch.arange(1, g + 1) * (2 * g + 1) - 1)
    assert torch.equal(geo.box[nl_idx][:, [0, 2]], torch.tensor([[0.0, 112.0]] * g))
    # the red square (70..84, 14..28): base token at (1, 2) (2 px per 1 px horizontally), tile token at (1, 5)
    red_base = (geo.box[:, 0] < 84) & (geo.box[:, 2] > 70) & (geo.box[:, 1] < 28) & (geo.box[:, 3] > 14) & base
    red_tile = (geo.box[:, 0] < 84) & (geo.box[:, 2] > 70) & (geo.box[:, 1] < 28) & (geo.box[:, 3] > 14) & tile
    assert [(geo.row[i].item(), geo.col[i].item()) for i in torch.nonzero(red_base).flatten()] == [(1, 2)]
    assert [(geo.row[i].item(), geo.col[i].item()) for i in torch.nonzero(red_tile).flatten()] == [(1, 5)]


def test_llava_next_unpads_a_letterboxed_image(adapters):
    a = adapters["llava_next"]
    e = a.encode(scene(100, 60), PROMPT)  # -> 112 x 112 canvas, padded rows removed by the model
    geo = e.geometry
    assert len(geo) == e.n_visual
    tile = torch.tensor([k == "tile" for k in geo.kind])
    rows, cols = geo.grids[1]
    assert int(tile.sum()) == rows * cols and rows < 2 * (IMAGE_SIZE // PATCH)
    assert bool((geo.box[tile][:, 2] <= 100).all() and (geo.box[tile][:, 3] <= 60).all())


def test_video_geometry_per_frame(encoded):
    e = encoded["video_llava", "video"]
    geo = e.geometry
    g = IMAGE_SIZE // PATCH
    assert e.is_video and len(e.frames) == 8 and geo.grids == [(g, g)] * 8
    assert e.n_visual == 8 * (g * g + 1)  # transformers' Video-LLaVA keeps each frame's CLS
    assert torch.equal(geo.frame, torch.arange(8).repeat_interleave(g * g + 1))
    assert geo.kind[: g * g + 1] == ["cls"] + ["patch"] * g * g
    # 80 x 60 frame: shortest edge 60 -> 56 (74 x 56), centre crop 56 -> 9 px cut each side
    patch = torch.tensor([k == "patch" for k in geo.kind])
    assert abs(geo.box[patch][:, 0].min().item() - 9 * 80 / 74) < 1e-4


@pytest.mark.parametrize("fam", ["llava", "llava_next", "video_llava"])
def test_vision_attention_capture(adapters, video_path, fam):
    a = adapters[fam]
    media = video_path if fam == "video_llava" else scene(square=RED)
    tower = a.model.model.video_tower if fam == "video_llava" else a.model.model.vision_tower
    plain = a.encode(media, PROMPT)  # transformers installs its own output-capturing hooks once

    def hooks():
        return {(name, k) for name, m in tower.named_modules() for k in m._forward_hooks}

    before = hooks()
    e = a.encode(media, PROMPT, need_attention=True)
    n = (IMAGE_SIZE // PATCH) ** 2 + 1
    if fam == "video_llava":  # block-diagonal over frames, every frame's CLS is a visual token
        assert not e.has_cls and e.attention.shape == (8 * n, 8 * n) == (e.n_visual, e.n_visual)
        assert e.keys.shape[0] == e.n_visual
        blocks = e.state.extra["attention_per_frame"]
        assert torch.equal(e.attention[n:2 * n, n:2 * n], blocks[1]) and e.attention[:n, n:].abs().sum() == 0
        torch.testing.assert_close(e.attention.sum(-1), torch.ones(8 * n))
    elif fam == "llava_next":  # all views, CLS first; the base view's block is the tower's own
        N = e.n_visual
        assert e.has_cls and e.attention.shape == (N + 1, N + 1) and e.keys.shape[0] == N + 1
        base = e.state.extra["attention_all"][0]  # (n, n): the base view, its CLS first
        assert torch.equal(e.attention[: n, : n][1:, 1:], base[1:, 1:]) and torch.equal(e.attention[0, 1:n], base[0, 1:])
        newline = torch.tensor([k == "newline" for k in e.geometry.kind])
        assert e.attention[1:][newline].abs().sum() == 0 and e.attention[0, 1:][newline].abs().sum() == 0
        # a tile token attends only to tile tokens (its own view), never to base or newline tokens
        kinds = e.geometry.kind
        tile = [i for i, k in enumerate(kinds) if k == "tile"]
        row = e.attention[1 + tile[0], 1:]
        assert float(row.sum()) > 0 and float(row.sum()) <= 1.0 + 1e-5
        assert {kinds[j] for j in torch.nonzero(row).flatten().tolist()} == {"tile"}
    else:
        assert e.has_cls and e.attention.shape == (n, n) and e.keys.shape[:-1] == (n,)
        torch.testing.assert_close(e.attention.sum(-1), torch.ones(n))
    # every attention-based pruner accepts the encoding as it is
    for name in ("attention", "visionzip", "vispruner", "mi_attention"):
        sel = mipruner.prune(name, visual=e.visual, text=e.scoring_text, budget=0.25,
                             attention=e.attention, keys=e.keys)
        assert sel.budget == round(0.25 * e.n_visual)
    # the hook is gone afterwards, and the visual tokens do not depend on attention capture
    assert hooks() == before
    assert torch.equal(plain.visual, e.visual)


# ---------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize("fam", ["llava", "llava_next", "video_llava"])
def test_errors(adapters, encoded, tmp_path, fam):
    a = adapters[fam]
    e = encoded[fam, "image"]
    with pytest.raises(ValueError, match="empty"):
        a.encode(scene(), "   ")
    with pytest.raises(ValueError, match="too long"):
        a.encode(scene(), "square " * MAX_POSITIONS)
    for bad in (torch.tensor([e.n_visual]), torch.tensor([-1]), torch.tensor([], dtype=torch.long)):
        with pytest.raises(ValueError):
            a.prefill_logits(e, keep=bad)
    with pytest.raises(ValueError, match="positions"):
        a.prefill_logits(e, positions="shuffled")
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not an image")
    with pytest.raises(MediaError):
        a.encode(str(junk), PROMPT)
    with pytest.raises(MediaError):
        a.encode(str(tmp_path / "missing.mp4"), PROMPT)
    if fam == "llava_next":
        with pytest.raises(MediaError, match="one image"):
            a.encode([scene(), scene(seed=1)], PROMPT)


def test_llava_reads_as_many_frames_as_fit_the_context(adapters, encoded, video_path, monkeypatch):
    """8 frames of LLaVA-1.5-7B (576 tokens an image) would pass its 4,096 positions: it reads 6; a small
    context reads fewer frames, still evenly sampled."""
    import transformers as tf
    from types import SimpleNamespace

    from mipruner.media import load_video, sample_indices
    from mipruner.models.llava.llava_hf import TEXT_ROOM, LlavaAdapter

    real = SimpleNamespace(config=tf.LlavaConfig(), max_positions=4096, default_frames=8)  # llava-1.5-7b-hf
    assert LlavaAdapter.video_frames(real) == 6
    assert LlavaAdapter.video_frames(SimpleNamespace(**(real.__dict__ | {"max_positions": 0}))) == 8
    a, per = adapters["llava"], encoded["llava", "image"].n_visual
    assert a.video_frames() == 8  # the tiny context holds 8
    monkeypatch.setattr(a, "max_positions", 4 * TEXT_ROOM)  # room 512 left: 1536 // per frames at most
    assert a.video_frames() == min(8, 3 * TEXT_ROOM // per)
    monkeypatch.setattr(a, "max_positions", 64)  # an eighth (8) left: 56 // 16 = 3 frames of the tiny tower
    assert per == 16 and a.video_frames() == 3
    video, clip = a._media(video_path), load_video(video_path, 3)  # what encode reads (the prompt then is too long)
    assert clip.indices == sample_indices(12, 3) and video.indices == clip.indices and all(
        f.tobytes() == g.tobytes() for f, g in zip(video.frames, clip.frames))


def test_text_mask_marks_the_question(encoded):
    e = encoded["llava", "image"]
    assert "".join(e.scoring_tokens).replace("\u0120", " ").strip() == PROMPT
    assert e.text.shape == (len(e.text_tokens), e.visual.shape[1])


def test_llava_reads_a_video_as_several_images(adapters, encoded):
    """LLaVA-1.5 has no video token: each sampled frame is one image with its own placeholder."""
    a, e = adapters["llava"], encoded["llava", "video"]
    img = encoded["llava", "image"]
    assert e.is_video and len(e.frames) == a.default_frames == 8
    assert e.n_visual == 8 * img.n_visual and e.geometry.grids == img.geometry.grids * 8
    assert e.geometry.frame.tolist() == [f for f in range(8) for _ in range(img.n_visual)]
    ids = e.state.input_ids
    assert int((ids == a.config.image_token_id).sum()) == e.n_visual
    # attention over all frames: one [CLS] row, blocks within frames, zeros across frames
    e2 = a.encode(e.frames, PROMPT, need_attention=True)
    n = img.n_visual
    att = e2.attention
    assert e2.has_cls and att.shape == (e2.n_visual + 1, e2.n_visual + 1)
    assert torch.all(att[1:n + 1, n + 1:2 * n + 1] == 0) and torch.all(att[1:n + 1, 1:n + 1] > 0)
    assert torch.all(att[0, 1:] > 0)
    single = a.encode(e.frames[3], PROMPT, need_attention=True)
    torch.testing.assert_close(att[3 * n + 1:4 * n + 1, 3 * n + 1:4 * n + 1], single.attention[1:, 1:])
    torch.testing.assert_close(att[0, 3 * n + 1:4 * n + 1], single.attention[0, 1:])
