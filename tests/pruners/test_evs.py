"""EVS (`mipruner/pruners/evs.py`) against a restatement of vLLM's released code (vllm-project/vllm,
vllm/multimodal/evs.py: `compute_retained_tokens_count`, `compute_retention_mask`), on the same inputs,
indices compared exactly; its budget, rate and error rules; no tensor made without device=."""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.pruners.evs import evs_pruner, retained_count
from mipruner.testing import meta_default

from ..conftest import TEST_DEVICE


def vllm_retained(tokens_per_frame: int, num_frames: int, q: float) -> int:
    """compute_retained_tokens_count, step by step."""
    total_tokens = tokens_per_frame * num_frames
    evs_num_tokens = int(total_tokens * (1 - q))
    return max(tokens_per_frame, evs_num_tokens)


def vllm_mask(video_embeds: torch.Tensor, thw: tuple[int, int, int], merge: int, q: float,
              retain: int | None = None) -> torch.Tensor:
    """compute_retention_mask, step by step: (T H' W',) bool. `retain` replaces the retained count (our budget)."""
    T, H, W = thw
    x = video_embeds.reshape(T, H // merge, W // merge, video_embeds.size(-1))
    tokens_per_frame = (H // merge) * (W // merge)
    dissim = 1 - torch.nn.functional.cosine_similarity(x[1:, ...], x[:-1, ...], dim=-1)
    dissim = torch.cat([255 * torch.ones_like(x[:1, :, :, 0]), dissim], dim=0)
    flat = dissim.view(-1)
    order = torch.argsort(flat, dim=-1, descending=True, stable=True)
    n = vllm_retained(tokens_per_frame, T, q) if retain is None else retain
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask[order[:n]] = True
    return mask


def video(T: int, h: int, w: int, d: int = 16, seed: int = 0, repeats: bool = True) -> torch.Tensor:
    """(T h w, d) tokens in Qwen's order (frame, row, col); with `repeats`, some tokens copy the previous
    frame's (dissimilarity 0 up to rounding: near-ties, so method and restatement run on one device) and some
    are zero rows (cos 0 exactly: ties the stable sort must break by index)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, h * w, d, generator=g)
    if repeats:
        same = torch.rand(T, h * w, generator=g) < 0.4
        for t in range(1, T):
            x[t, same[t]] = x[t - 1, same[t]]
        x[T // 2, :2] = 0.0
    return x.reshape(T * h * w, d)


CASES = [(2, 4, 6, 0.5), (4, 2, 2, 0.75), (5, 6, 4, 0.3), (3, 4, 4, 0.7), (8, 2, 3, 0.9), (6, 4, 4, 0.0)]


@pytest.mark.parametrize("T,h,w,q", CASES)
def test_rate_equals_vllm(T, h, w, q):
    """The rate alone (budget = N_V): exactly vLLM's retained tokens."""
    x = video(T, h, w, seed=T)
    n = x.shape[0]
    frame = torch.arange(T).repeat_interleave(h * w)
    sel = mipruner.prune("evs", visual=x.to(TEST_DEVICE), budget=n, frame_index=frame, video_pruning_rate=q)
    # the restatement on the method's device: a copied token's 1 - cos is 0 up to rounding (+-1e-7), which each
    # device's kernels round their own way (an H200 ordered two such near-ties apart from the CPU's restatement)
    want = vllm_mask(x.to(TEST_DEVICE), (T, 2 * h, 2 * w), 2, q).nonzero().flatten()
    assert sel.keep.cpu().tolist() == want.cpu().tolist()
    assert sel.keep.numel() == vllm_retained(h * w, T, q) == retained_count(h * w, T, q)


@pytest.mark.parametrize("T,h,w,q", CASES)
@pytest.mark.parametrize("share", [0.1, 0.5, 1.0])
def test_budget_is_the_retained_count(T, h, w, q, share):
    """A budget B: vLLM's ranking cut at B (q = 0), or at min(B, vLLM's count) (q > 0)."""
    x = video(T, h, w, seed=10 + T)
    n = x.shape[0]
    b = max(1, int(share * n))
    frame = torch.arange(T).repeat_interleave(h * w)
    sel = mipruner.prune("evs", visual=x, budget=b, frame_index=frame, video_pruning_rate=q)
    k = b if q == 0 else min(b, vllm_retained(h * w, T, q))
    assert sel.keep.tolist() == vllm_mask(x, (T, 2 * h, 2 * w), 2, q, retain=k).nonzero().flatten().tolist()
    assert sel.budget == k


def test_keep_all_and_rate_zero():
    x = video(4, 3, 3)
    frame = torch.arange(4).repeat_interleave(9)
    assert mipruner.prune("evs", visual=x, budget=36, frame_index=frame).keep.tolist() == list(range(36))
    assert mipruner.prune("evs", visual=x, budget=1.0, frame_index=frame,
                          video_pruning_rate=0.0).keep.tolist() == list(range(36))


def test_rate_07_keeps_frame_zero_of_a_short_video():
    """vLLM's note: at q = 0.7 a video of T <= 3 keeps frame 0 only."""
    x = video(3, 4, 4, repeats=False)
    sel = mipruner.prune("evs", visual=x, budget=48, frame_index=torch.arange(3).repeat_interleave(16),
                         video_pruning_rate=0.7)
    assert sel.keep.tolist() == list(range(16))


def test_scores_and_extras():
    x = video(3, 2, 2)
    sel = mipruner.prune("evs", visual=x, budget=6, frame_index=torch.arange(3).repeat_interleave(4))
    d = sel.extras["dissimilarity"]
    want = 1 - torch.nn.functional.cosine_similarity(x[4:], x[:-4], dim=-1)
    assert torch.equal(d[1:].flatten(), want) and torch.equal(d[0], torch.ones(4))
    assert torch.equal(sel.scores[4:], want) and torch.equal(sel.scores[:4], torch.full((4,), 2.0))
    assert sel.extras["frames"].tolist() == torch.arange(12).view(3, 4).tolist()


def test_tokens_of_no_frame_rank_last():
    """OneVision's closing newline (frame_index -1) is kept only once every frame token is."""
    x = video(3, 2, 2)
    x = torch.cat([x, torch.randn(1, x.shape[1])])
    frame = torch.cat([torch.arange(3).repeat_interleave(4), torch.tensor([-1])])
    assert 12 not in mipruner.prune("evs", visual=x, budget=12, frame_index=frame).keep.tolist()
    assert mipruner.prune("evs", visual=x, budget=13, frame_index=frame).keep.tolist() == list(range(13))
    # interleaved frames (Video-LLaVA's [CLS] first in each frame): slots by index within each frame
    frame = torch.tensor([0, 1, 0, 1, 0, 1])
    y = torch.randn(6, 8)
    sel = mipruner.prune("evs", visual=y, budget=4, frame_index=frame)
    want = vllm_mask(y[[0, 2, 4, 1, 3, 5]], (2, 3, 1), 1, 0.0, retain=4).nonzero().flatten()
    assert sel.keep.tolist() == sorted(torch.tensor([0, 2, 4, 1, 3, 5])[want].tolist())


@pytest.mark.parametrize("q", [1.0, -0.1, 1.5, float("nan")])
def test_rate_outside_zero_one_is_a_sentence(q):
    frame = torch.arange(2).repeat_interleave(4)
    with pytest.raises(ValueError, match="video_pruning_rate must be (in|a number)"):
        mipruner.prune("evs", visual=torch.randn(8, 4), budget=4, frame_index=frame, video_pruning_rate=q)
    if q == q:  # the function's own check (the registry's edge validates first)
        with pytest.raises(ValueError, match=r"video_pruning_rate must be in \[0, 1\)"):
            evs_pruner(torch.randn(8, 4), None, 4, frame_index=frame, video_pruning_rate=q)


def test_one_frame_and_unequal_frames_are_sentences():
    with pytest.raises(ValueError, match="EVS compares each frame with the previous one: this input has 1 frame"):
        mipruner.prune("evs", visual=torch.randn(8, 4), budget=4)
    with pytest.raises(ValueError, match="this input has 1 frame"):
        mipruner.prune("evs", visual=torch.randn(8, 4), budget=4, frame_index=torch.zeros(8, dtype=torch.long))
    with pytest.raises(ValueError, match="frames of different sizes: frame 0 has 5 visual tokens, frame 1 has 3"):
        mipruner.prune("evs", visual=torch.randn(8, 4), budget=4, frame_index=torch.tensor([0] * 5 + [1] * 3))


def test_registration():
    spec = mipruner.get_pruner("evs")
    assert spec.video and spec.adaptive and spec.stage == "projector" and "per_frame" not in spec.param_names
    assert spec.param_names == ("video_pruning_rate",) and spec.inputs == ("frame_index",)
    for name in mipruner.list_pruners():  # the per-frame option: every pre-LLM method but the video ones
        spec = mipruner.get_pruner(name)
        assert ("per_frame" in spec.param_names) == (spec.stage != "llm" and not spec.video), name
        assert ("frame_index" in spec.accepts) == (spec.stage != "llm"), name


def test_no_tensor_without_device():
    """Under the meta default device the selection is the same (every tensor takes device= from its inputs)."""
    x = video(4, 3, 3)
    frame = torch.arange(4).repeat_interleave(9)
    want = mipruner.prune("evs", visual=x, budget=36, frame_index=frame, video_pruning_rate=0.5)
    with meta_default():
        got = mipruner.prune("evs", visual=x, budget=36, frame_index=frame, video_pruning_rate=0.5)
        got7 = mipruner.prune("evs", visual=x, budget=7, frame_index=frame)
    assert got.keep.device.type == "cpu" and torch.equal(got.keep, want.keep) and torch.equal(got.scores, want.scores)
    assert torch.equal(got7.keep, mipruner.prune("evs", visual=x, budget=7, frame_index=frame).keep)
