"""VidCom2 against a restatement of its release (xuyang-liu16/VidCom2, token_compressor/vidcom2/vidcom2.py,
`vidcom2_compression`'s steps), written here in plain torch from the released steps, on the same inputs."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mipruner
from mipruner.pruners.vidcom2 import frame_counts, vidcom2_scores

from .video_inputs import video_frames, video_tokens


def released(flat: torch.Tensor, tpf: int, base_scale: float, topk=torch.topk) -> tuple[torch.Tensor, list[int]]:
    """The release's kept indices of `flat` (T tpf, d) and its per-frame counts, step by step as released:
    lowest-variance half of the channels (topk, largest=False), normalised frames, multi-scale Gaussian
    similarity to the video and frame centres, softmax frame scales, per-frame topk(largest=False), offsets.
    topk: the release's torch.topk (`video_inputs.stable_topk` where scores tie: ties to the lower index)."""
    variances = flat.var(dim=0, unbiased=False)
    _, channels = topk(variances, k=int(flat.shape[-1] * 0.5), largest=False)
    frames = F.normalize(flat[:, channels].view(-1, tpf, channels.numel()), dim=-1)
    vid_center = frames.mean(dim=(0, 1), keepdim=True)
    frame_center = frames.mean(dim=1, keepdim=True)
    alphas = [2 ** k for k in range(-3, 2)]
    v_score = sum(torch.exp(-((frames - vid_center) ** 2).sum(dim=-1) / (2 * a)) for a in alphas)
    f_score = sum(torch.exp(-((frames - frame_center) ** 2).sum(dim=-1) / (2 * a)) for a in alphas)
    scores = -v_score.mean(dim=-1)
    probs = F.softmax((scores - scores.max()) / 0.01, dim=0)
    scales = (base_scale * (1 + probs - probs.mean())).clamp(max=1.0)
    ks = (scales * tpf).round().long().clamp(min=1).tolist()
    out = []
    for i, k in enumerate(ks):
        _, idx = topk((v_score + f_score)[i], k=k, largest=False, sorted=False)
        out.append(idx.sort().values + i * tpf)
    return torch.cat(out), ks


CASES = [dict(t=8, h=4, w=4, d=24, scenes=(0, 3, 6)), dict(t=6, h=3, w=5, d=16, scenes=(0, 2)),
         dict(t=4, h=6, w=6, d=32, scenes=(0, 1, 2, 3))]


@pytest.mark.parametrize("case", CASES)
def test_equals_the_release_where_its_counts_sum_to_the_budget(case):
    t, n = case["t"], case["h"] * case["w"]
    v = video_tokens(t, n, case["d"], scenes=case["scenes"])
    frame_index = video_frames(t, n)
    matched = 0
    for k in range(t, t * n):
        want, ks = released(v, n, k / (t * n))
        sel = mipruner.prune("vidcom2", visual=v, budget=k, frame_index=frame_index)
        got = sel.keep
        assert got.numel() == k
        if sum(ks) == k:
            matched += 1
            assert torch.equal(got, want), k
            assert sel.extras["frame_tokens"].tolist() == ks
        elif sum(ks) > k:  # a surplus dropped: what is kept, the release keeps
            assert bool(torch.isin(got, want).all()), k
        else:  # a shortfall filled: what the release keeps is kept
            assert bool(torch.isin(want, got).all()), k
    assert matched >= 10  # the equality above was checked on many budgets


def test_scores_and_counts_are_the_releases_formulas():
    t, n, d = 6, 12, 20
    v = video_tokens(t, n, d, scenes=(0, 4))
    score, uniq = vidcom2_scores(v.view(t, n, d))
    variances = v.var(dim=0, unbiased=False)
    ch = torch.topk(variances, k=d // 2, largest=False).indices
    fr = F.normalize(v[:, ch].view(t, n, -1), dim=-1)
    g = lambda c: sum(torch.exp(-((fr - c) ** 2).sum(-1) / (2 * a)) for a in (0.125, 0.25, 0.5, 1, 2))  # noqa: E731
    vs, fs = g(fr.mean(dim=(0, 1), keepdim=True)), g(fr.mean(dim=1, keepdim=True))
    torch.testing.assert_close(score, vs + fs, rtol=0, atol=1e-6)  # the same ops, in float32
    torch.testing.assert_close(uniq, -vs.mean(-1), rtol=0, atol=1e-6)
    # a frame unlike the others gets the larger budget
    assert int(frame_counts(uniq, 0.25, n).argmax()) in (4, 5)


def test_newline_of_no_frame_is_kept_and_the_frames_share_the_rest():
    t, h, w, d = 6, 3, 4, 16
    n = h * w
    v = torch.cat([video_tokens(t, n, d, scenes=(0, 3)), torch.randn(1, d)])
    frame_index = video_frames(t, n, newline=True)
    for k in (10, 25, 40):
        sel = mipruner.prune("vidcom2", visual=v, budget=k, frame_index=frame_index)
        assert sel.keep.numel() == k and int(sel.keep[-1]) == t * n  # the newline, last
        frames_only = mipruner.prune("vidcom2", visual=v[:-1], budget=k - 1, frame_index=frame_index[:-1])
        assert torch.equal(sel.keep[:-1], frames_only.keep)


def test_one_frame_and_frames_of_different_sizes_get_a_sentence():
    v = video_tokens(2, 16, 16)
    for frame_index in (None, torch.zeros(32, dtype=torch.long)):  # an image; a 1-frame video
        with pytest.raises(ValueError, match="1 frame"):
            mipruner.prune("vidcom2", visual=v, budget=7, frame_index=frame_index)
    with pytest.raises(ValueError, match="frames of different sizes"):
        mipruner.prune("vidcom2", visual=v, budget=7, frame_index=(torch.arange(32) >= 20).long())


def test_keep_all_and_bad_frame_index():
    t, h, w, d = 4, 3, 3, 8
    v = video_tokens(t, h * w, d)
    sel = mipruner.prune("vidcom2", visual=v, budget=t * h * w, frame_index=video_frames(t, h * w))
    assert sel.keep.tolist() == list(range(t * h * w)) and sel.tokens is None
    with pytest.raises(ValueError, match="frame_index must be"):
        mipruner.prune("vidcom2", visual=v, budget=5, frame_index=video_frames(t, h * w)[:-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_tensor_made_off_the_inputs_device_and_low_precision(dtype):
    """Under the meta default device (tests/test_meta_device.py's pattern) a tensor made without device= breaks
    the run; the selection equals the one made without it, on video inputs with a newline of no frame."""
    from mipruner.testing import meta_default

    from ..conftest import TEST_DEVICE
    t, h, w, d = 8, 4, 4, 24
    v = torch.cat([video_tokens(t, h * w, d, scenes=(0, 3, 6)), torch.randn(1, d)]).to(TEST_DEVICE, dtype)
    frame_index = video_frames(t, h * w, newline=True).to(TEST_DEVICE)
    ref = mipruner.prune("vidcom2", visual=v, budget=33, frame_index=frame_index)
    with meta_default():
        from mipruner.pruners import video
        video.clear_tables()  # the frame table laid out afresh under the meta default
        got = mipruner.prune("vidcom2", visual=v, budget=33, frame_index=frame_index)
    for name in ("keep", "order", "scores"):
        a, b = getattr(got, name), getattr(ref, name)
        assert a.device.type == TEST_DEVICE.type and torch.equal(a, b), name  # cuda:0 is not == cuda
    assert got.keep.numel() == 33 and bool(torch.isfinite(got.scores).all())
