"""DyCoke's two rules as plain tensor functions (Tao et al., "DyCoke: Dynamic Compression of Tokens for Fast
Video Large Language Models", arXiv 2411.15024); the method that runs them, before the LLM and while it
decodes, is `mipruner.inllm.dycoke`.

Original: KD-TAO/DyCoke. Stage 1, temporal token merging (TTM): `llava/model/llava_arch.py`, function
`dycole_ttm` (called in `prepare_inputs_labels_for_multimodal` on the video's flattened frame tokens with
`dycoke_num_tokens_per_frame` and `dycoke_k`). Stage 2, dynamic pruning of the KV cache while decoding (DP):
`llava/model/language_model/modeling_qwen2.py`, `PrunableDynamicCache.dycoke_pruning` and `update_cache`,
called from `Qwen2Model.forward` at layer `dycoke_l` on each one-token step.

TTM, restated on the (T, P) frame table (`video.frame_slots`: T frames of P tokens), with r = dycoke_k and
n = int((1 - r) P) tokens kept of each pruned frame:
  * pairs (i, i+1), i = 0, 2, ...: s_j = cos(normalize(x_i), normalize(x_i+1)) per slot; frame i stays whole
    and frame i+1 keeps the n slots of LOWEST similarity, read from the similarities of pair (i-2)//2 (the
    release's index: the first pair reads the last pair's);
  * groups of four, i = 0, 4, ... < T - 4: frame i+2 keeps instead the n slots least like frame i
    (cos(x_i, x_i+2)), frame i stays whole.
Deviations, on purpose: an odd last frame (which the release's pair loop leaves out of the video) stays
whole; T <= 4 runs no group-of-four pass (the release's `torch.stack` of an empty list fails there); the kept
tokens of a frame stay in sequence order (the release writes them in `topk` order).

Fidelity options (`ties`, `dtype`): ties "topk" picks with `torch.topk` as the release (ties in the kernel's
order), "stable" with a stable sort (ties to the lower index); dtype "model" computes the cosines in the
features' dtype as the release (bf16 / fp16 on a GPU), "float32" in float32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

TIES = ("topk", "stable")
DTYPES = ("model", "float32")


def check_option(name: str, value, allowed: tuple) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def smallest(scores: torch.Tensor, k: int, ties: str) -> torch.Tensor:
    """Indices of the k lowest of `scores` (last dim): `torch.topk(largest=False)` ("topk") or a stable
    ascending sort ("stable", ties to the lower index)."""
    if ties == "topk":
        return torch.topk(scores, k, dim=-1, largest=False).indices
    return torch.sort(scores, dim=-1, stable=True).indices[..., :k]


def largest(scores: torch.Tensor, k: int, ties: str) -> torch.Tensor:
    """Indices of the k highest of `scores` (1-D): `torch.topk` ("topk") or a stable descending sort."""
    if ties == "topk":
        return torch.topk(scores, k).indices
    return torch.sort(scores, descending=True, stable=True).indices[:k]


def pruned_frames(t: int) -> list[int]:
    """The frames TTM prunes of a video of t frames (the others stay whole): the odd frames of the pairs and
    frame i+2 of each group of four (i = 0, 4, ... < t - 4)."""
    odd = list(range(1, 2 * len(range(0, t - 1, 2)), 2))
    return sorted(odd + [i + 2 for i in range(0, t - 4, 4)])


def ttm_keep(x: torch.Tensor, merge_ratio: float, *, ties: str = "topk", dtype: str = "model",
             count: int | None = None) -> torch.Tensor:
    """TTM's kept slots: (T, P) bool of x (T, P, d), the frame tokens in frame order (module docstring).
    count: the tokens each pruned frame keeps, instead of int((1 - merge_ratio) P)."""
    t, p = int(x.shape[0]), int(x.shape[1])
    x = x if dtype == "model" else x.float()
    n = int((1 - merge_ratio) * p) if count is None else int(count)
    keep = torch.ones(t, p, dtype=torch.bool, device=x.device)
    starts = list(range(0, t - 1, 2))
    if not starts:
        return keep
    a, b = x[0:2 * len(starts):2], x[1:2 * len(starts):2]  # (pairs, P, d)
    sims = F.cosine_similarity(F.normalize(a, p=2, dim=-1), F.normalize(b, p=2, dim=-1), dim=-1)  # (pairs, P)
    read = torch.tensor([(i - 2) // 2 for i in starts], device=x.device) % len(starts)  # the release's index
    picked = smallest(sims.index_select(0, read), n, ties)  # (pairs, n)
    odd = torch.zeros(len(starts), p, dtype=torch.bool, device=x.device).scatter_(1, picked, True)
    keep[1:2 * len(starts):2] = odd
    quads = list(range(0, t - 4, 4))
    if quads:
        q = torch.tensor(quads, device=x.device)
        s2 = F.cosine_similarity(x.index_select(0, q), x.index_select(0, q + 2), dim=-1)  # (groups, P)
        picked2 = smallest(s2, n, ties)
        keep[q + 2] = torch.zeros(len(quads), p, dtype=torch.bool, device=x.device).scatter_(1, picked2, True)
    return keep


def dp_keep(attention: torch.Tensor, previous: torch.Tensor | None, prune_ratio: float, *, threshold: float = 0.9,
            ties: str = "topk") -> torch.Tensor:
    """DP's kept span tokens at one decoding step: (S,) bool of the span's attention (S,) (module docstring
    of `mipruner.inllm.dycoke`). The top int(S (1 - p)) by attention when this step's attention is unlike
    the previous step's (cosine < threshold; the first step always), else every one (the release clears its
    gather index at each step and sets it only when the attention moved)."""
    s = int(attention.shape[0])
    k = int(s * (1 - prune_ratio))
    top = torch.zeros(s, dtype=torch.bool, device=attention.device)
    top[largest(attention, k, ties)] = True
    if previous is None:
        return top
    moved = F.cosine_similarity(attention, previous, dim=0) < threshold
    return torch.where(moved, top, torch.ones_like(top))


__all__ = ["DTYPES", "TIES", "check_option", "dp_keep", "largest", "pruned_frames", "smallest", "ttm_keep"]
