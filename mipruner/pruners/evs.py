"""EVS, Efficient Video Sampling ("Efficient Video Sampling: Pruning Temporally Redundant Tokens for Faster VLM
Inference", arXiv 2510.14624): a video's tokens that repeat the previous frame are dropped before the LLM.

Original: vLLM, repository vllm-project/vllm, file vllm/multimodal/evs.py, functions
`compute_retention_mask` and `compute_retained_tokens_count` (called by
vllm/model_executor/models/qwen2_5_vl.py `_postprocess_video_embeds_evs`, and by qwen3_vl.py on the
embeddings with their deepstack features); `--video-pruning-rate` is its rate q.

The rule, per video, on the visual tokens after the merger, as (T, P) slots (`video.frame_slots`: T frames,
P tokens each; for Qwen T counts token-frames, temporal grid slices of 2 sampled frames, and the slots are the
H' x W' raster of the merged grid, vLLM's (T, H', W') flattened):
    d[t, p] = 1 - cos(x[t, p], x[t - 1, p])  for t >= 1        (torch.nn.functional.cosine_similarity)
    d[0, p] = 255                                               (frame 0 is always kept first)
    order   = argsort(d flattened, descending, stable)           (ties to the lower token index)
    keep    = the first K of `order`, in their original order.
K, from the rate q = `video_pruning_rate` in [0, 1) and the budget B (the registry's normal budget):
    q = 0   K = B: the budget alone (B = N_V keeps every token: the unpruned model);
    q > 0   K = min(B, max(P, int(T P (1 - q)))) + 0: vLLM's `compute_retained_tokens_count`, capped by the
            budget, so the method is adaptive (the budget is its cap; at the default budget, all tokens, the
            rate alone decides, as in vLLM). At q = 0.7 a video of T <= 3 frames keeps frame 0 only.
A budget B < P keeps the first B tokens of frame 0 (vLLM's minimum of one frame is the rate's, not the budget's).
Tokens of no frame (OneVision's closing newline) rank last (below any dissimilarity): kept only when the budget
covers every frame token; they do not count in T P.

Deviations, on purpose: the cosine is computed in float32 (vLLM: in the embeddings' dtype); the positions of the
kept tokens are not recomputed: every adapter gathers the kept tokens' columns of the unpruned prompt's
position ids (transformers' `get_rope_index` on the unpruned ids), which is what vLLM's
`compute_mrope_for_media` / `recompute_mrope_positions` rebuild, without its integer cast of
`second_per_grid_ts` (t collapses at fps > 2) or its `llm_grid_w` offset for the text after the video. Qwen3-VL's
deepstack features are pruned by the same keep (its adapter gathers them with the kept rows).

The frame table is laid out on the host once per frame_index and memoized (`video.frame_slots`); the rest is
device work, one capturable computation (`Capturable(static=("frame_index",))`, replayed as a CUDA graph on CUDA).

Scores: d with frame 0 (and the tokens of no frame, which rank last) shown as 2, the ceiling of 1 - cos;
`extras["dissimilarity"]` (T, P) float32 with row 0 = 1 (frame 0 against an empty frame), `extras["frames"]`
the (T, P) token table, for drawing per frame, `extras["k_note"]` what the rate and the budget did (`k_note`, the
app's panel note; host integers only). Errors, as sentences naming the field: a rate outside [0, 1), an
input of one frame (an image, a 1-frame video; for Qwen, 2 sampled frames make one token-frame), frames of
different sizes.
"""
from __future__ import annotations

import torch

from ._registry import Param, register_pruner
from .capture import Capturable
from .selection import Selection
from .video import NotApplicable, dissimilarity, frame_slots

FIRST = 255.0  # vLLM's key for frame 0: above any 1 - cos


def retained_count(per_frame: int, frames: int, q: float) -> int:
    """Tokens EVS keeps of a video of `frames` frames of `per_frame` tokens at rate q (vLLM's
    `compute_retained_tokens_count`): max(one frame, int(T P (1 - q)))."""
    return max(per_frame, int(per_frame * frames * (1 - q)))


def k_note(per_frame: int, frames: int, q: float, budget: int) -> str:
    """What the rate and the budget did to this input, in a sentence (the panel's note): K, where it came
    from, and what it left to frames 2..T after frame 1, which EVS keeps first (it has no previous frame)."""
    slots = per_frame * frames
    if q == 0:
        k, why = budget, f"K = {budget} of {slots} tokens (rate 0: the budget alone)"
    else:
        r = retained_count(per_frame, frames, q)
        k = min(budget, r)
        why = (f"K = {k} of {slots} tokens (rate {q:g}: max(one frame, int({frames} x {per_frame} x (1 - {q:g}))) = {r}"
               + (f", capped by the budget {budget})" if budget < r else f", under the budget {budget})"))
    if k < per_frame:
        rest = (f"under one frame ({per_frame} tokens): frame 1 only (kept first), frames 2-{frames} get none; "
                f"a budget over {per_frame} keeps what changes in them")
    elif k == per_frame:
        rest = f"frame 1 whole, frames 2-{frames} none (one frame's worth)"
    else:
        rest = (f"frame 1 whole ({per_frame}), then the {min(k, slots) - per_frame} tokens of frames 2-{frames} least "
                "like the same patch of the previous frame")
    return f"{why}; {rest}"


def check_rate(q) -> float:
    """q as a float in [0, 1), else ValueError naming video_pruning_rate."""
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= float(q) < 1:
        raise ValueError(f"video_pruning_rate must be in [0, 1) (0: the budget alone decides), got {q!r}")
    return float(q)


@register_pruner("evs", stage="projector", video=True, adaptive=True, label="EVS (video)",
                 capture=Capturable(static=("frame_index",), batch=False),
                 score_label="dissimilarity to the previous frame (1 - cos)", params=(
                     Param.real("video_pruning_rate", 0.0, 0.0, 1.0,
                                "EVS's rate q, vLLM's --video-pruning-rate: keep max(one frame, int(T P (1 - q))) "
                                "tokens, capped by the budget; 0: the budget alone", high_open=True, step=0.05, code="vpr"),))
def evs_pruner(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *,
               frame_index: torch.Tensor | None = None, video_pruning_rate: float = 0.0) -> Selection:
    """EVS: the tokens least like the same place in the previous frame, frame 0 whole first (vLLM's video pruning)."""
    q = check_rate(video_pruning_rate)
    n, dev = visual.shape[0], visual.device
    frames = frame_slots(frame_index, n, dev)
    if frames.count < 2:
        raise NotApplicable("EVS compares each frame with the previous one: this input has 1 frame (an image or a "
                         "1-frame video; Qwen makes one token-frame of 2 sampled frames); give it a video of more "
                         "frames, or choose an image method")
    d = dissimilarity(visual, frames)  # (T, P) float32, row 0 = 1
    key = torch.cat([torch.full_like(d[:1], FIRST), d[1:]]).flatten()
    tokens = frames.index.flatten()
    order = torch.sort(key, descending=True, stable=True).indices
    slots = frames.count * frames.per_frame
    k = budget if q == 0 else min(budget, retained_count(frames.per_frame, frames.count, q))
    picked = tokens[order[: min(k, slots)]]
    if k > slots:  # tokens of no frame rank last
        picked = torch.cat([picked, frames.outside[: k - slots]])
    scores = torch.full((n,), 2.0, dtype=torch.float32, device=dev)
    scores[tokens] = torch.cat([torch.full_like(d[:1], 2.0), d[1:]]).flatten()
    sel = Selection.from_order(picked, scores)
    sel.extras.update(dissimilarity=d, frames=frames.index.clone(),  # the table is memoized: a copy
                      k_note=k_note(frames.per_frame, frames.count, q, budget))
    return sel


__all__ = ["check_rate", "evs_pruner", "k_note", "retained_count"]
