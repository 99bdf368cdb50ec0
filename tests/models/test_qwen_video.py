"""Qwen video rules (`mipruner.models.qwen.video`) against the installed transformers code.

The Qwen video processors cannot be built or imported without torchvision (CI has none), so the
references are their functions compiled from the installed transformers source (`official.installed`):
`Qwen2VLVideoProcessor.sample_frames` / `.patchify`, `Qwen3VLVideoProcessor.sample_frames` / `.patchify`,
the Qwen3 module's `smart_resize`, and the class defaults read from the class bodies.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from mipruner.media import MediaError
from mipruner.models.qwen import video as QV

from .official import QWEN2_VIDEO, QWEN3_VIDEO, VideoFunctions, class_attributes, installed

FPS = [1.0, 2.5, 6.0, 24.0, 29.97, 30.0]
TOTALS = [2, 3, 4, 5, 7, 8, 9, 15, 16, 31, 100, 301]
CONFIGS = [{}, {"fps": 2.0}, {"fps": 2.0, "min_frames": 4, "max_frames": 8}, {"fps": 0.5}, {"num_frames": 6},
           {"num_frames": 5}, {"fps": 4.0, "max_frames": 12}]


@pytest.mark.parametrize("qwen3,relpath,cls", [(False, QWEN2_VIDEO, "Qwen2VLVideoProcessor"),
                                               (True, QWEN3_VIDEO, "Qwen3VLVideoProcessor")])
def test_defaults_are_the_official_class_attributes(qwen3, relpath, cls):
    official = class_attributes(relpath, cls)
    ours = QV.QWEN3_DEFAULTS if qwen3 else QV.QWEN2_DEFAULTS
    shared = [k for k in ours if k in official]
    assert len(shared) >= 13
    for k in shared:
        assert ours[k] == official[k], k
    # not class attributes: transformers' defaults (VideosKwargs -> None, VideoProcessorMixin.rescale_factor)
    assert {k: ours[k] for k in ours if k not in official} == (
        {"rescale_factor": 1 / 255} if qwen3 else {"rescale_factor": 1 / 255, "fps": None, "num_frames": None})


def test_settings_come_from_the_file_transformers_reads(tmp_path):
    import json

    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 3136, "max_pixels": 12845056,
                                                                   "patch_size": 14}))
    cfg = QV.video_processor_dict(str(tmp_path))
    s = QV.video_settings(cfg, qwen3=False)
    assert s["size"] == {"shortest_edge": 3136, "longest_edge": 12845056} and s["do_sample_frames"] is False
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({"fps": 1.0, "do_sample_frames": True}))
    s = QV.video_settings(QV.video_processor_dict(str(tmp_path)), qwen3=False)
    assert s["fps"] == 1.0 and s["size"] == QV.QWEN2_DEFAULTS["size"]
    (tmp_path / "processor_config.json").write_text(json.dumps({"video_processor": {"num_frames": 4}}))
    assert QV.video_processor_dict(str(tmp_path)) == {"num_frames": 4}


@pytest.mark.parametrize("qwen3", [False, True])
def test_frame_sampling_equals_the_official_sample_frames(qwen3):
    from transformers.video_utils import VideoMetadata

    fn = installed(*(QWEN3_VIDEO, "Qwen3VLVideoProcessor.sample_frames") if qwen3 else
                   (QWEN2_VIDEO, "Qwen2VLVideoProcessor.sample_frames"))
    checked = 0
    for extra in CONFIGS:
        s = QV.video_settings(dict(extra, do_sample_frames=True), qwen3=qwen3)
        for total in TOTALS:
            for fps in FPS:
                meta = VideoMetadata(total_num_frames=total, fps=fps)
                kw = dict(num_frames=s["num_frames"], fps=s["fps"])
                if not qwen3:
                    kw.update(temporal_patch_size=2, min_frames=s["min_frames"], max_frames=s["max_frames"])
                try:
                    ref = np.asarray(fn(SimpleNamespace(**s), meta, **kw)).tolist()
                except ValueError:  # the official processor refuses: so do we
                    with pytest.raises(MediaError):
                        (QV.qwen3_indices if qwen3 else QV.qwen2_indices)(total, fps, s)
                    continue
                except (TypeError, ZeroDivisionError):
                    # Qwen2 only: sampling on with neither fps nor num_frames (None > int), or fewer
                    # frames than the temporal patch (division by zero): we read every frame
                    assert not qwen3 and (total < 2 or s["fps"] is s["num_frames"] is None)
                    assert QV.qwen2_indices(total, fps, s) == list(range(total))
                    continue
                ours = (QV.qwen3_indices if qwen3 else QV.qwen2_indices)(total, fps, s)
                assert ours == ref, (extra, total, fps)
                checked += 1
    assert checked > 350


def test_issue_cases():
    """15 frames at 6 fps, default 2-fps sampling: Qwen2 [0, 3, 7, 11], Qwen3 [0, 4, 7, 10, 14];
    5 frames of 640x360 with Qwen3-VL's defaults resize to (288, 512) (not (256, 480): t = 5, not 6)."""
    s2 = QV.video_settings({"fps": 2.0, "do_sample_frames": True}, qwen3=False)
    assert QV.qwen2_indices(15, 6.0, s2) == [0, 3, 7, 11]
    s3 = QV.video_settings({}, qwen3=True)
    assert QV.qwen3_indices(15, 6.0, s3) == [0, 4, 7, 10, 14]
    assert QV.resize_target(5, 360, 640, s3, 32, 2, qwen3=True) == (288, 512)


def test_short_clips():
    """1 frame: Qwen2-VL's fps rule divides by zero in transformers (we read the frame, as with
    do_sample_frames off); Qwen3-VL's resize refuses fewer frames than the temporal patch (so do we)."""
    from transformers.video_utils import VideoMetadata

    s2 = QV.video_settings({"fps": 2.0, "do_sample_frames": True}, qwen3=False)
    with pytest.raises(ZeroDivisionError):
        installed(QWEN2_VIDEO, "Qwen2VLVideoProcessor.sample_frames")(
            SimpleNamespace(**s2), VideoMetadata(total_num_frames=1, fps=6.0), temporal_patch_size=2, min_frames=4,
            max_frames=768, num_frames=None, fps=2.0)
    assert QV.qwen2_indices(1, 6.0, s2) == [0]
    s3 = QV.video_settings({}, qwen3=True)
    assert QV.qwen3_indices(1, 6.0, s3) == [0]
    with pytest.raises(ValueError, match="temporal_factor"):
        installed(QWEN3_VIDEO, "smart_resize")(1, 360, 640, temporal_factor=2, factor=32)
    with pytest.raises(MediaError, match="at least 2 frames"):
        QV.resize_target(1, 360, 640, s3, 32, 2, qwen3=True)


def test_resize_rules_equal_the_official_ones():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as qwen2_resize

    qwen3_resize = installed(QWEN3_VIDEO, "smart_resize")
    s2, s3 = QV.video_settings({}, qwen3=False), QV.video_settings({}, qwen3=True)
    for t in (2, 3, 5, 8, 17, 64):
        for h, w in ((360, 640), (20, 1000), (1000, 20), (333, 517), (28, 28), (1080, 1920), (12, 40)):
            lo, hi = s3["size"]["shortest_edge"], s3["size"]["longest_edge"]
            assert QV.resize_target(t, h, w, s3, 32, 2, qwen3=True) == qwen3_resize(
                t, h, w, temporal_factor=2, factor=32, min_pixels=lo, max_pixels=hi)
            if min(h, w) >= 28:
                lo, hi = s2["size"]["shortest_edge"], s2["size"]["longest_edge"]
                assert QV.resize_target(t, h, w, s2, 28, 2, qwen3=False) == qwen2_resize(
                    h, w, factor=28, min_pixels=lo, max_pixels=hi)


def test_cap_pixels_per_frame():
    """The official `resize` with cap_pixels_per_frame (its lines restated; the method itself calls
    torchvision): Qwen2 caps each frame at an even share of 0.9 * max_video_tokens, Qwen3 at
    min(max_video_tokens, longest_edge / t) tokens per frame, both floored at 1.05 * shortest_edge."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as qwen2_resize

    s2 = QV.video_settings({"cap_pixels_per_frame": True, "max_video_tokens": 2000}, qwen3=False)
    lo, hi = s2["size"]["shortest_edge"], s2["size"]["longest_edge"]
    for t in (4, 16, 64):
        cap = max(min(hi, int(2000 * 28 * 28 * 0.9) * 2 // t), int(lo * 1.05))
        assert QV.resize_target(t, 1080, 1920, s2, 28, 2, qwen3=False) == qwen2_resize(1080, 1920, 28, lo, cap)
    s3 = QV.video_settings({"cap_pixels_per_frame": True}, qwen3=True)
    lo, hi = s3["size"]["shortest_edge"], s3["size"]["longest_edge"]
    qwen3_resize = installed(QWEN3_VIDEO, "smart_resize")
    for t in (4, 16, 64):
        per = max(min(768 * 32 * 32, hi // t), int(lo * 1.05))
        assert QV.resize_target(t, 1080, 1920, s3, 32, 2, qwen3=True) == qwen3_resize(
            t, 1080, 1920, temporal_factor=2, factor=32, min_pixels=lo, max_pixels=per * t)
    uncapped = QV.resize_target(64, 1080, 1920, QV.video_settings({}, qwen3=False), 28, 2, qwen3=False)
    assert math.prod(QV.resize_target(64, 1080, 1920, s2, 28, 2, qwen3=False)) < math.prod(uncapped)


@pytest.mark.parametrize("qwen3", [False, True])
def test_pixels_equal_the_official_patchify_layout(qwen3):
    """Our patches (PIL image processor per frame, regrouped) == the official patchify applied to
    the same resized, rescaled and normalised frames; an odd frame count pads with the last frame."""
    from transformers import Qwen2VLImageProcessorPil

    s = QV.video_settings({"patch_size": 14, "merge_size": 2, "size": {"shortest_edge": 3136,
                                                                       "longest_edge": 5 * 56 * 56}}, qwen3=qwen3)
    rng = np.random.default_rng(0)
    frames = [Image.fromarray(rng.integers(0, 256, (50, 90, 3), dtype=np.uint8)) for _ in range(5)]
    ip = Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2)
    target = QV.resize_target(5, 50, 90, s, 28, 2, qwen3=qwen3)
    pixels, grid = QV.video_pixels(frames, target, s, ip, 14, 2, 2)
    ref_pixels, ref_grid = VideoFunctions("qwen3" if qwen3 else "qwen2", s).qwen_pixels(frames)
    assert torch.equal(grid, ref_grid) and grid[0, 0] == 3
    torch.testing.assert_close(pixels, ref_pixels, atol=1e-6, rtol=0)
