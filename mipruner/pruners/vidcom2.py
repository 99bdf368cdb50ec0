"""VidCom2 (Liu et al. 2025, "Video Compression Commander: Plug-and-Play Inference Acceleration for Video
Large Language Models", arXiv:2505.14454): per-frame budgets from each frame's uniqueness, then the most
distinct tokens within each frame.

Original: xuyang-liu16/VidCom2, `token_compressor/vidcom2/vidcom2.py`, `vidcom2_compression` and its steps
`select_low_var_channels`, `compute_gaussian_scores` (with `_multi_scale_gaussian`), `compute_scales`,
`select_outlier_indices`, `_map_linear_offset`; called per video on the projected (after the merger /
pooling) tokens, e.g. `token_compressor/vidcom2/models/qwen2_5_vl.py` `_compute_keep_indices`. vLLM ships it
as `--video-retention-ratio` (vllm-project/vllm PR 47750). Its retention ratio `R_RATIO` is our K / N_V.

    X (T, n, d): the frames' projected tokens (`video.frame_slots`: T frames of n tokens each, from the
               encoding's `frame_index`; Qwen's frames are its temporal grid slices of 2 sampled frames)
    channels:  the floor(d / 2) channels of lowest variance over all T n tokens (biased variance); X~ the
               tokens on them, each row L2-normalised
    centres:   c_V = mean of every X~ row; c_t = mean of frame t's rows
    G(x, c) =  sum over a in {1/8, 1/4, 1/2, 1, 2} of exp(-||x - c||^2 / (2 a))      (multi-scale Gaussian)
    s_V(t, i) = G(X~[t, i], c_V);  s_F(t, i) = G(X~[t, i], c_t);  score = s_V + s_F (similarity: low = distinct)
    frame uniqueness u_t = -mean_i s_V(t, i); p = softmax((u - max u) / 0.01) over frames
    scale_t = min(1, r (1 + p_t - mean(p))),  r = K_f / (T n)
    k_t = max(1, round(scale_t n))   (round half to even, as torch.round)
    frame t keeps its k_t tokens of lowest score; survivors in index order

The count: the release's k_t sum to K_f only up to rounding (and less where a scale is clamped at 1); vLLM's
port reconciles to an exact count the same way (its placeholders are sized first). Here the K_f tokens kept
are: the release's survivors when they are K_f, else its survivors of lowest score (a surplus dropped from
the least distinct) or all of them plus the dropped tokens of lowest score (a shortfall filled by the most
distinct), so K is exact and equals the release whenever its counts sum to K_f.

Tokens of no frame (OneVision's newline after a video, frame_index -1) are kept, as the release appends
OneVision's newline after the pruned frames; the frames share K_f = K - M (M such tokens; K <= M keeps the
first K of them). K = N_V keeps every token (the unpruned model). An input of one frame (an image, a 1-frame
video) or frames of different sizes get a sentence (ValueError), as every video method's.

Deliberate deviations: the exact count above; ties broken to the lower index (stable sorts: the release's
`torch.topk` leaves ties to the kernel); computed in float32 whatever the input dtype. LLaVA-Video's
row-newline mapping (`_map_grid_vid`) has no family here; every family's frames come from its geometry.
Cost: O(T n d) for the scores, O(T n log n) for the per-frame ranking; the frame table is laid out on the host
once per frame_index (`video.frame_slots`), the rest is device work with fixed shapes: one capturable computation
(`Capturable(static=("frame_index",))`, a CUDA graph on CUDA; not batched: it ranks in place).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._registry import register_pruner
from .capture import Capturable
from .selection import Selection
from .video import NotApplicable, frame_slots

ALPHAS = (0.125, 0.25, 0.5, 1.0, 2.0)  # release: [2**k for k in range(-3, 2)]
TEMPERATURE = 0.01  # release: compute_scales(temp=0.01)
CHANNEL_SHARE = 0.5  # release: select_low_var_channels(ratio=0.5)


def gaussian(x: torch.Tensor, centre: torch.Tensor) -> torch.Tensor:
    """sum_a exp(-||x - c||^2 / (2 a)) over the last dim, a in ALPHAS, summed in the release's order."""
    dist_sq = ((x - centre) ** 2).sum(dim=-1)
    out = torch.zeros_like(dist_sq)
    for a in ALPHAS:
        out = out + torch.exp(-dist_sq / (2 * a))
    return out


def vidcom2_scores(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(score (T, n) = s_V + s_F, uniqueness u (T,)) of the frames' tokens x (T, n, d), in float32."""
    t, n, d = x.shape
    flat = x.reshape(t * n, d).to(torch.float32)  # (T n, d)
    var = flat.var(dim=0, unbiased=False)  # (d,)
    channels = torch.sort(var, stable=True).indices[: int(d * CHANNEL_SHARE)]  # lowest variance first
    frames = F.normalize(flat.index_select(1, channels), dim=-1).view(t, n, -1)  # (T, n, d'); a gather
    s_video = gaussian(frames, frames.mean(dim=(0, 1), keepdim=True))  # (T, n)
    s_frame = gaussian(frames, frames.mean(dim=1, keepdim=True))  # (T, n)
    return s_video + s_frame, -s_video.mean(dim=-1)


def frame_counts(uniqueness: torch.Tensor, ratio: float, n: int) -> torch.Tensor:
    """k_t (T,) int64: the release's tokens per frame, max(1, round(min(1, r (1 + p - mean p)) n))."""
    probs = F.softmax((uniqueness - uniqueness.max()) / TEMPERATURE, dim=0)  # (T,)
    scales = (ratio * (1 + probs - probs.mean())).clamp(max=1.0)
    return (scales * n).round().long().clamp(min=1)


def vidcom2_keep(x: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(chosen (K_f,) flat indices into the T n tokens, score (T, n), kept per frame (T,)) for `budget` of the
    T n tokens of x (T, n, d); fixed shapes, no host sync."""
    t, n, _ = x.shape
    score, uniq = vidcom2_scores(x)
    counts = frame_counts(uniq, budget / (t * n), n)  # (T,)
    rank = torch.empty_like(score, dtype=torch.long)  # (T, n) each token's place in its frame, most distinct 0
    order = torch.sort(score, dim=1, stable=True).indices
    rank.scatter_(1, order, torch.arange(n, device=x.device).expand(t, n))
    released = rank < counts[:, None]  # (T, n) the release's survivors
    flat = score.reshape(-1)
    by_score = torch.sort(flat, stable=True).indices  # most distinct first
    first = torch.sort((~released.reshape(-1)[by_score]).to(torch.int8), stable=True).indices  # survivors first
    chosen = by_score[first[:budget]]  # (K_f,) exact count (see the module docstring)
    kept = torch.zeros(t * n, dtype=torch.long, device=x.device).index_fill(0, chosen, 1).view(t, n)
    return chosen, score, kept.sum(dim=1)


def video_frames(frame_index: torch.Tensor | None, n_v: int, device: torch.device, method: str):
    """(frames (T, n), free (M,)): `video.frame_slots`; `video.NotApplicable` (a ValueError) naming `method` on
    an input of one frame, which the app shows in that method's panel alone."""
    table = frame_slots(frame_index, n_v, device)
    if table.count < 2:
        raise NotApplicable(f"{method} shares its budget over a video's frames: this input has 1 frame (an image or a "
                         "1-frame video; Qwen makes one token-frame of 2 sampled frames); give it a video of more "
                         "frames, or choose an image method")
    return table.index, table.outside


@register_pruner("vidcom2", stage="projector", video=True, label="VidCom2 (video)",
                 capture=Capturable(static=("frame_index",), batch=False),
                 score_label="similarity to the video and frame centres (lowest kept)")
def vidcom2_pruner(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *,
                   frame_index: torch.Tensor | None = None) -> Selection:
    """VidCom2: per-frame budgets from frame uniqueness, then each frame's most distinct tokens."""
    n_v, dev = visual.shape[0], visual.device
    frames, free = video_frames(frame_index, n_v, dev, "VidCom2")  # (T, n), (M,)
    if budget >= n_v:  # keep-all: the unpruned input
        return Selection.from_order(torch.arange(n_v, device=dev), torch.zeros(n_v, device=dev))
    t, n = frames.shape
    scores = torch.zeros(n_v, dtype=torch.float32, device=dev)
    k_frames = budget - free.numel()
    if k_frames <= 0:  # the budget does not reach the frames: the first K tokens of no frame
        return Selection.from_order(free[:budget], scores, extras={"frame_tokens": frames.new_zeros(t)})
    chosen, score, per_frame = vidcom2_keep(visual.index_select(0, frames.reshape(-1)).view(t, n, -1), k_frames)
    scores = scores.index_copy(0, frames.reshape(-1), score.reshape(-1))
    keep = torch.sort(torch.cat([frames.reshape(-1)[chosen], free])).values
    return Selection.from_order(keep, scores, extras={"frame_tokens": per_frame})


__all__ = ["frame_counts", "gaussian", "video_frames", "vidcom2_keep", "vidcom2_pruner", "vidcom2_scores"]
