"""FastVID (Shen et al., NeurIPS 2025, "FastVID: Dynamic Density Pruning for Fast Video Large Language
Models", arXiv:2503.11187): dynamic temporal segments, then per frame the most attended tokens and, per
segment, density-peak anchors into which the other tokens are merged.

Original: LunarShen/FastVID, `fastvid_llavaonevision/LLaVA-NeXT/llava/model/language_model/modeling_qwen2.py`,
`Qwen2Model.forward`, the block "FastVID" (DySeg, STPrune: ATS, parallel density score, DTM for single- and
multi-frame segments): the README's core code, the paper's parallel implementation, run with
`scripts/eval.sh`'s settings, which are the defaults here (DySeg_c 8, DySeg_tau 0.9, STPrune_d 0.4, DTM_p 4,
DTM_beta 0.6; `fastvid_retention_ratio` is our K / N_V).

    frames X (T, n, d) (`video.frame_slots`, from `frame_index`), attention a (T, n) (`attention.attention_scores`)
    DySeg:  g_t = the frame's mean token, L2-normalised; s_t = cos(g_t, g_{t+1}) for t < T - 1; a segment
            ends after frame t when s_t is among the c - 1 lowest or s_t < tau
    budget: R = floor(K_f / T) per frame (the release's int(n * ratio)); S = R - int(R d) salient,
            C = R - S context tokens
    anchors per segment of L frames: its last frame and every p-th before it are targets (ceil(L / p) of
            them), each given floor(C L / ceil(L / p)) anchors; the other frames of the segment get none
    ATS:    frame t keeps its S tokens of highest a
    density, on the n - S other tokens of each frame (Euclidean distances / sqrt(d)):
            rho_i = exp(-mean of the squared distances to its 4 nearest, itself included)
            delta_i = min distance to a token of higher rho (the frame's largest distance when none)
            score_i = delta_i rho_i
    DTM:    a target frame's anchors = its tokens of highest score; each other token of the frame (a
            single-frame segment) or of the whole segment (a multi-frame one) goes to its most similar
            anchor (cosine; anchors included); anchor := w anchor + (1 - w) mean(assigned),
            w = max(1 / (count + 1), beta)
    Selection: keep = the salient tokens and the anchors, at their own positions (the release's
            position ids are the kept tokens' original ones); tokens = their rows (anchors merged);
            merged_into = for every other token, the anchor it went into (in a multi-frame segment, the
            anchor of the nearest target at or after its frame; the release merges it into one anchor of
            every target of the segment).

The release keeps T S + sum over segments of ceil(L / p) floor(C L / ceil(L / p)) <= K_f tokens: the method
is adaptive, the budget its cap. Tokens of no frame (OneVision's newline after the video, frame_index -1)
are kept, as the release keeps the newline; the frames share K_f = K - M. K = N_V keeps every token. Below one
token a frame (K_f < T, where the release keeps none) the K_f tokens of highest attention over the video are
kept (ATS alone). An input of one frame or frames of different sizes get a sentence (ValueError).

Deliberate deviations: the release adds uniform noise of 1e-6 to rho (random ties), here none: equal rho
is broken by index, deterministically (of two tokens of equal rho the lower-indexed one is the denser), so a
flat region of repeated tokens yields one density peak, as the noise makes it, and not all of a frame's anchors;
a segment is one- or multi-frame by its length (the release decides by its targets' anchor count, which
files a multi-frame segment whose targets get exactly C anchors, such as C = 1, L = 3, p = 2, or any L > 1 with
p = 1, as one-frame segments: the same kept tokens, but its non-target frames then merge into nothing); the frame's global feature is its mean projected token (the
release's Qwen2.5-VL port, `fastvid_qwen25vl/.../modeling_qwen2_5_vl.py`, does this; on OneVision it reads
SigLIP's attention-pooling head, which no family here exposes), and ATS ranks by the encoder attention every
attention method reads (`attention.attention_scores`: [CLS] attention, or the attention a token receives)
instead of that head's probe attention; with fewer than c frames every frame boundary is a cut (the release
needs T >= c); fewer than 4 tokens: the nearest available; C = 0: no anchors (the release's DTM fails there);
anchors clamped to a frame's tokens; zero rows normalise to zero (no NaN); computed in float32, returned in
`visual`'s dtype. The release's Qwen2.5-VL port
is a different, sequential variant (sub-segments by `DySeg_ignore`, segment-level budgets), not this one.
Cost: O(T (n - S)^2 d) for the distances; one host read of the segment boundaries (data-dependent shapes: it
always runs eagerly, `Capturable(when=...)` never true).
"""
from __future__ import annotations

import torch

from ._registry import Param, register_pruner
from .attention import attention_scores
from .capture import Capturable
from .selection import Selection, top_indices, unit_rows
from .vidcom2 import video_frames

NEIGHBOURS = 4  # release: torch.topk(dist_matrix, k=4, largest=False)


def segment_sizes(g: torch.Tensor, cuts: int, tau: float) -> list[int]:
    """DySeg: the frames per segment, in order, from the frames' global features g (T, d)."""
    t = g.shape[0]
    if t == 1:
        return [1]
    u = unit_rows(g)
    sim = (u[:-1] * u[1:]).sum(dim=1)  # (T - 1,) cosine of consecutive frames
    cut = sim < tau
    low = torch.sort(sim, stable=True).indices[: min(cuts - 1, t - 1)]  # the c - 1 least similar pairs
    cut = cut.index_fill(0, low, True)
    ends = torch.cat([cut.nonzero().flatten().cpu(), torch.tensor([t - 1], device="cpu")])  # one host read
    return torch.diff(ends, prepend=torch.tensor([-1], device="cpu")).tolist()


def context_counts(sizes: list[int], per_frame: int, stride: int) -> list[int]:
    """Anchors of each frame (host ints): a segment of L frames gives floor(C L / ceil(L / p)) to its last
    frame and every p-th before it, none to the others."""
    out = []
    for size in sizes:
        each = per_frame * size // ((size + stride - 1) // stride)
        out += [each if (size - 1 - i) % stride == 0 else 0 for i in range(size)]
    return out


def density_scores(x: torch.Tensor) -> torch.Tensor:
    """delta * rho (B, m) of each frame's tokens x (B, m, d), float32 (see the module docstring)."""
    dist = torch.cdist(x, x) / (x.shape[-1] ** 0.5)  # (B, m, m)
    near = torch.topk(dist, k=min(NEIGHBOURS, x.shape[1]), dim=-1, largest=False).values
    rho = torch.exp(-(near ** 2).mean(dim=-1))  # (B, m)
    idx = torch.arange(x.shape[1], device=x.device)
    tie = (rho[:, None, :] == rho[:, :, None]) & (idx[None, :] < idx[:, None])[None]  # equal rho: lower index wins
    higher = ((rho[:, None, :] > rho[:, :, None]) | tie).to(dist.dtype)  # [b, i, j]: j is denser than i
    far = dist.flatten(1).max(dim=-1).values[:, None, None]
    delta = (dist * higher + far * (1 - higher)).min(dim=-1).values
    return delta * rho


def merge(anchors: torch.Tensor, sources: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(merged anchors (B, A, d), assignment (B, S) anchor slot of each source) for anchors (B, A, d) and
    sources (B, S, d): DTM's anchor := w anchor + (1 - w) mean(assigned), w = max(1 / (count + 1), beta)."""
    assign = torch.bmm(unit_rows(sources), unit_rows(anchors).transpose(1, 2)).argmax(dim=2)  # (B, S)
    onehot = (assign[:, :, None] == torch.arange(anchors.shape[1], device=anchors.device)).to(anchors.dtype)
    count = onehot.sum(dim=1)[:, :, None]  # (B, A, 1)
    weight = (1 / (count + 1)).clamp(min=beta)
    mean = torch.bmm(onehot.transpose(1, 2), sources) / count.clamp(min=1)
    return weight * anchors + (1 - weight) * mean, assign


def _top(x: torch.Tensor, k: int) -> torch.Tensor:
    """(B, k) indices of the k largest of each row, ties to the lower index."""
    return torch.sort(x, dim=1, descending=True, stable=True).indices[:, :k]


@register_pruner("fastvid", stage="vision", needs=("attention",), adaptive=True, video=True, label="FastVID (video)",
                 capture=Capturable(when=lambda n_v, params: False),  # its segments are read on the host: eager
                 score_label="attention share", params=(
    Param.integer("segments", 8, 1, None, "DySeg c: at least c segments (the c - 1 least similar frame pairs cut)"),
    Param.real("segment_tau", 0.9, -1.0, 1.0, "DySeg tau: cut where consecutive frames' cosine is below it",
               step=0.01),
    Param.real("context_share", 0.4, 0.0, 1.0, "STPrune d: share of each frame's budget given to merged anchors",
               step=0.05),
    Param.integer("anchor_stride", 4, 1, None, "DTM p: every p-th frame of a segment holds its anchors"),
    Param.real("merge_beta", 0.6, 0.0, 1.0, "DTM beta: least weight an anchor keeps in its merged token",
               step=0.05)))
def fastvid_pruner(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *,
                   attention: torch.Tensor | None = None,
                   keys: torch.Tensor | None = None,  # unused; every attention pruner takes the same inputs
                   frame_index: torch.Tensor | None = None,
                   segments: int = 8, segment_tau: float = 0.9, context_share: float = 0.4,
                   anchor_stride: int = 4, merge_beta: float = 0.6) -> Selection:
    """FastVID: dynamic temporal segments, then the most attended tokens and merged density-peak anchors."""
    n_v, dev = visual.shape[0], visual.device
    attn = attention_scores(attention, n_v, method="fastvid").to(dev)  # (N_V,)
    frames, free = video_frames(frame_index, n_v, dev, "FastVID")  # (T, n), (M,)
    if budget >= n_v:  # keep-all: the unpruned input
        return Selection.from_order(torch.arange(n_v, device=dev), attn)
    t, n = frames.shape
    per_frame = (budget - free.numel()) // t  # R
    if per_frame < 1:  # under one token a frame: ATS alone over the video (the release keeps none)
        k_f = max(budget - free.numel(), 0)
        order = torch.cat([frames.reshape(-1)[top_indices(attn[frames.reshape(-1)], k_f)], free])[:budget]
        return Selection.from_order(order, attn, merged_into=torch.full((n_v,), -1, dtype=torch.long, device=dev),
                                    positions="original",
                                    extras={"frame_tokens": torch.zeros(n_v, dtype=torch.long, device=dev).index_fill(
                                        0, order, 1)[frames].sum(1)})
    salient_n = per_frame - int(per_frame * context_share)  # S
    context_n = per_frame - salient_n  # C
    x = visual.to(torch.float32).index_select(0, frames.reshape(-1)).view(t, n, -1)  # (T, n, d)
    a = attn[frames]  # (T, n)
    salient = _top(a, salient_n)  # (T, S) frame-local
    is_salient = torch.zeros(t, n, dtype=torch.bool, device=dev).scatter(1, salient, True)
    rest = torch.argsort(is_salient.to(torch.int8), dim=1, stable=True)[:, : n - salient_n]  # (T, m) ascending
    xr = torch.gather(x, 1, rest[:, :, None].expand(-1, -1, x.shape[-1]))  # (T, m, d)
    score = density_scores(xr)  # (T, m)
    sizes = segment_sizes(x.mean(dim=1), segments, segment_tau)
    counts = context_counts(sizes, context_n, anchor_stride)

    rows = visual.to(torch.float32).clone()  # (N_V, d) kept rows, anchors replaced by their merges
    merged_into = torch.full((n_v,), -1, dtype=torch.long, device=dev)
    rest_global = torch.gather(frames, 1, rest)  # (T, m) global indices
    anchors_all = [frames.gather(1, salient).reshape(-1)]
    # the release's parallel design: every one-frame target (C anchors, its own frame merged) in one batched
    # call, then each multi-frame segment (more anchors, the whole segment merged) in one call of its own
    # A segment is one- or multi-frame by its length (the release tests the anchor count against C, which
    # files a multi-frame segment whose targets get exactly C anchors, e.g. C = 1, L = 3, p = 2, or p = 1,
    # as one-frame segments and merges none of its other frames' tokens).
    groups, start = [([], None)], 0
    for size in sizes:
        seg = list(range(start, start + size))
        start += size
        if context_n == 0:
            continue
        if size == 1:
            groups[0][0].append(seg[0])
        else:
            groups.append(([f for f in seg if counts[f] > 0], seg))
    m = n - salient_n
    for targets, seg in groups:
        if not targets:
            continue
        tg = torch.tensor(targets, device=dev)
        slot = _top(score[tg], min(counts[targets[0]], m))  # (G, k) anchors in the target frames' rest
        anchor_ids = torch.gather(rest_global[tg], 1, slot)  # (G, k) global
        anchor_rows = torch.gather(xr[tg], 1, slot[:, :, None].expand(-1, -1, x.shape[-1]))
        if seg is None:  # one-frame DTM: each target merges its own frame
            sources, source_ids = xr[tg], rest_global[tg]  # (G, m, d), (G, m)
        else:  # multi-frame DTM: each target merges the whole segment
            sources = xr[seg[0]: seg[-1] + 1].reshape(1, -1, x.shape[-1]).expand(len(targets), -1, -1)
            source_ids = rest_global[seg[0]: seg[-1] + 1].reshape(1, -1).expand(len(targets), -1)
        merged, assign = merge(anchor_rows, sources, merge_beta)
        rows.index_copy_(0, anchor_ids.reshape(-1), merged.reshape(-1, x.shape[-1]))  # our own copy: in place
        went = torch.gather(anchor_ids, 1, assign)  # (G, S) the anchor each source went into, per target
        if seg is None:
            merged_into = merged_into.index_copy(0, source_ids.reshape(-1), went.reshape(-1))
        else:  # one record per token: the nearest target at or after its frame
            src_frame = torch.arange(seg[0], seg[-1] + 1, device=dev).repeat_interleave(m)
            own = src_frame + (seg[-1] - src_frame) % anchor_stride  # its target frame
            row = torch.searchsorted(tg, own)  # (S,) which target row
            merged_into = merged_into.index_copy(0, source_ids[0], went[row, torch.arange(row.numel(), device=dev)])
        anchors_all.append(anchor_ids.reshape(-1))
    kept_frames = torch.cat(anchors_all)
    keep = torch.sort(torch.cat([kept_frames, free])).values
    merged_into = merged_into.index_fill(0, keep, -1)  # a kept token is not merged into anything
    per_frame_kept = torch.zeros(n_v, dtype=torch.long, device=dev).index_fill(0, kept_frames, 1)[frames].sum(1)
    density = torch.zeros(n_v, dtype=torch.float32, device=dev).index_copy(0, rest_global.reshape(-1),
                                                                           score.reshape(-1))
    seg_of_frame = torch.repeat_interleave(torch.arange(len(sizes), device=dev), torch.tensor(sizes, device=dev))
    return Selection.from_order(torch.cat([kept_frames, free]), attn, tokens=rows[keep].to(visual.dtype),
                                merged_into=merged_into, positions="original",
                                extras={"frame_tokens": per_frame_kept, "segment": seg_of_frame, "density": density})


__all__ = ["context_counts", "density_scores", "fastvid_pruner", "merge", "segment_sizes"]
