"""PruneVid, its pre-LLM stage (Huang et al., "PruneVid: Visual Token Pruning for Efficient Video Large Language
Models", arXiv:2412.16117): the video cut into segments of alike frames, each segment's static tokens averaged over
time, and the static and each frame's dynamic tokens merged by density-peak clustering.

Original: Visual-AI/PruneVid, `models/pllava/modeling_pllava.py`, `merge_frames_dynamic` with `cluster_dpc_knn`,
`refine_clusters`, `segment_lengths`, `spatial_merge_tokens` and `compute_cluster_vectors` (LightCompress ships the
same stage as ModelTC/LightCompress `llmc/compression/token_reduction/prunevid.py`, on LLaVA-OneVision's pooled
frames); defaults from its `scripts/eval.sh`: tau 0.8, temporal_segment_ratio 0.25, cluster_ratio 0.5; k = 7.

    frames X (T, P, d) (`video.frame_slots`)
    DPC-KNN(Y (n, d), c, k):  D = cdist(Y, Y) / sqrt(d) (float32); rho_i = exp(-mean of the k smallest D_ij^2,
              itself included); delta_i = min D_ij over rho_j > rho_i (the largest D when none); centres = the c of
              largest delta rho; each row joins its nearest centre (the first on ties), a centre itself
    segments: DPC-KNN on the frames' mean tokens, c = int(T temporal_segment_ratio), k = 7; `refine_clusters`:
              each cluster keeps its longest runs of consecutive frames (every run of that length; a cluster whose
              runs are all single frames keeps none), every other run takes the label of its longer neighbouring
              run (left on equal lengths; 0 with none); segments = the runs of equal labels
    static:   in a segment of W frames, s_p = mean over ordered pairs of its frames w != t of cos(x_w,p, x_t,p);
              slot p is static where s_p > tau. Static slots: their mean over the W frames, one row each; dynamic
              slots: each frame's own rows
    merge:    a group of rows (a segment's static rows; each frame's dynamic rows) of more than 14 rows is
              DPC-KNN clustered with c = int(rows cluster_ratio), k = 7, each cluster one row, its members' mean

Here each output row sits at its centre's token (a static row: that slot in the segment's first frame), so
keep = those tokens in index order, tokens = the rows, merged_into = for every other token of a cluster (of a static
slot: its W tokens) the kept token. The release keeps C = sum of the groups' row counts tokens: the method is
adaptive, the budget its cap: K_f = K - M (M tokens of no frame, OneVision's newline, kept as the release keeps it);
where C > K_f the K_f rows are shared over the groups in proportion to their counts (`video.split_budget`) and
each group is clustered to its share. K = N_V keeps every token (the unpruned model).

Not expressed: PruneVid's second stage, inside the LLM (at `selected_layer` the question's attention to the video
picks the top alpha of the visual tokens, whose KV cache the later layers keep); mipruner's pre-LLM methods select
before the LLM and this one stays there: it is the first stage alone.

Deliberate deviations: the release adds uniform noise of 1e-6 to rho (random ties), here none (ties: neither row is
the other's higher-density neighbour) and the c centres are taken with ties to the lower index (a stable sort);
k is at most the rows clustered, c at least 1 (the release fails with fewer than 7 frames or 4); a segment of one
frame has no static slot (the release's 0 / 0 is NaN, which is no slot either); the rows enter the LLM at their
centres' places, not as the release's new sequence (each segment's static rows, then its frames' dynamic rows);
computed in float32, returned in `visual`'s dtype. Cost: O(n^2 d) a group; two host reads (the frame labels, the
static slots), then host-sized groups: it runs eagerly.
"""
from __future__ import annotations

import torch

from ._registry import Param, register_pruner
from .capture import Capturable
from .selection import Selection
from .vidcom2 import video_frames
from .video import split_budget

NEIGHBOURS = 7  # release: cluster_dpc_knn(..., k=7)
SMALL = 14  # release: `if static_feat.shape[1] > 14` (groups this small are not clustered)


def density_peaks(y: torch.Tensor, k: int = NEIGHBOURS) -> tuple[torch.Tensor, torch.Tensor]:
    """(score (n,) delta * rho, dist (n, n)) of rows y (n, d) by DPC-KNN, in float32: rho = exp(-mean squared
    distance to the k nearest, itself included), delta = distance to the nearest denser row (the largest distance
    for the densest), distances / sqrt(d). PruneVid's and HoliTom's releases share this `cluster_dpc_knn`."""
    n = y.shape[0]
    yf = y.to(torch.float32)
    dist = torch.cdist(yf[None], yf[None])[0] / (y.shape[-1] ** 0.5)  # (n, n)
    near = torch.sort(dist, dim=-1, stable=True).values[:, : min(k, n)]
    rho = torch.exp(-(near ** 2).mean(dim=-1))  # (n,)
    higher = (rho[None, :] > rho[:, None]).to(dist.dtype)  # [i, j]: rho_j > rho_i
    delta = (dist * higher + dist.max() * (1 - higher)).min(dim=-1).values
    return delta * rho, dist


def dpc_knn(y: torch.Tensor, clusters: int, k: int = NEIGHBOURS) -> tuple[torch.Tensor, torch.Tensor]:
    """(label (n,) int64 cluster of each row, centres (c,) row of each cluster) of rows y (n, d): DPC-KNN as in
    the module docstring, in float32."""
    c = max(1, min(clusters, y.shape[0]))
    score, dist = density_peaks(y, k)
    centres = torch.sort(score, descending=True, stable=True).indices[:c]
    label = dist[centres].argmin(dim=0)  # (n,) nearest centre, the first on ties
    label = label.index_copy(0, centres, torch.arange(c, device=y.device))
    return label, centres


def refine(labels: list[int]) -> list[int]:
    """`refine_clusters` on one sequence of T frame labels (host ints; see the module docstring)."""
    out = list(labels)
    n = len(out)
    runs: dict[int, list[tuple[int, int]]] = {}
    i = 0
    while i < n:
        j = i
        while j + 1 < n and labels[j + 1] == labels[i]:
            j += 1
        runs.setdefault(labels[i], []).append((i, j))
        i = j + 1
    for segs in runs.values():
        longest = max(e - s + 1 for s, e in segs)
        for s, e in segs:
            if longest == 1 or e - s + 1 != longest:  # every run of the longest length stays
                out[s: e + 1] = [-1] * (e - s + 1)
    i = 0
    while i < n:
        if out[i] != -1:
            i += 1
            continue
        start = i
        while i < n and out[i] == -1:
            i += 1
        end = i - 1
        left = right = None
        left_len = right_len = 0
        if start > 0:
            left = out[start - 1]
            p = start - 1
            while p >= 0 and out[p] == left:
                p -= 1
            left_len = start - p - 1
        if end < n - 1:
            right = out[end + 1]
            p = end + 1
            while p < n and out[p] == right:
                p += 1
            right_len = p - end - 1
        new = left if left_len > right_len else right if right_len > left_len else (left if left is not None else right)
        out[start: end + 1] = [0 if new is None else new] * (end - start + 1)
    return out


def runs(labels: list[int]) -> list[int]:
    """The lengths of the runs of equal labels, in order (`segment_lengths`)."""
    out = [1]
    for a, b in zip(labels, labels[1:]):
        if a == b:
            out[-1] += 1
        else:
            out.append(1)
    return out


def static_similarity(x: torch.Tensor) -> torch.Tensor:
    """(P,) mean cosine of each slot over the ordered pairs of distinct frames of x (W, P, d); W = 1: NaN."""
    w = x.shape[0]
    u = torch.nn.functional.normalize(x, p=2, dim=-1)
    sim = torch.einsum("wlc,tlc->wtl", u, u)  # (W, W, P)
    return (sim.sum(dim=1) - 1).sum(dim=0) / (w * (w - 1))


def cluster_counts(sizes: list[int], ratio: float) -> list[int]:
    """The release's rows of each group: int(n ratio) clusters for a group of n > 14 rows, else n."""
    return [int(s * ratio) if s > SMALL else s for s in sizes]


@register_pruner("prunevid", stage="projector", video=True, adaptive=True, label="PruneVid (video)",
                 capture=Capturable(when=lambda n_v, params: False),  # its segments are read on the host: eager
                 score_label="similarity to its segment's other frames (cos)", params=(
    Param.real("prunevid_tau", 0.8, -1.0, 1.0, "PruneVid tau: a slot is static where its mean cosine over the "
               "segment's frames is above it", step=0.05),
    Param.real("prunevid_segment_ratio", 0.25, 0.0, 1.0, "PruneVid: temporal clusters as a share of the frames",
               low_open=True, step=0.05),
    Param.real("prunevid_cluster_ratio", 0.5, 0.0, 1.0, "PruneVid: clusters as a share of a group's tokens "
               "(static ones, each frame's dynamic ones)", low_open=True, step=0.05)))
def prunevid_pruner(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *,
                    frame_index: torch.Tensor | None = None, prunevid_tau: float = 0.8,
                    prunevid_segment_ratio: float = 0.25, prunevid_cluster_ratio: float = 0.5) -> Selection:
    """PruneVid: segments of alike frames, static tokens averaged over time, then density-peak clusters merged."""
    n_v, dev = visual.shape[0], visual.device
    frames, free = video_frames(frame_index, n_v, dev, "PruneVid")  # (T, P), (M,)
    t, p = frames.shape
    x = visual.to(torch.float32)[frames]  # (T, P, d)
    if budget >= n_v:  # keep-all: the unpruned input
        return Selection.from_order(torch.arange(n_v, device=dev), torch.zeros(n_v, device=dev))
    k_f = budget - free.numel()
    if k_f <= 0:  # the budget does not reach the frames: the first K tokens of no frame
        return Selection.from_order(free[:budget], torch.zeros(n_v, device=dev))
    label, _ = dpc_knn(x.mean(dim=1), int(t * prunevid_segment_ratio))
    sizes = runs(refine(label.cpu().tolist()))  # host read 1: T labels
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    sims = torch.stack([static_similarity(x[s: s + w]) for s, w in zip(starts, sizes)])  # (S, P)
    static_all = (sims > prunevid_tau).cpu()  # host read 2: the static slots of every segment
    groups = []  # (rows (n, d), tokens (n, m) the video's tokens each row averages, place (n,) its own token)
    for seg, (s, w) in enumerate(zip(starts, sizes)):
        static = static_all[seg]
        st = torch.nonzero(static).flatten().to(dev)
        dy = torch.nonzero(~static).flatten().to(dev)
        if st.numel():
            members = frames[s: s + w].index_select(1, st).T  # (n, W)
            groups.append((x[s: s + w].index_select(1, st).mean(dim=0), members, members[:, 0]))
        for f in range(s, s + w):
            if dy.numel():
                own = frames[f].index_select(0, dy)
                groups.append((x[f].index_select(0, dy), own[:, None], own))
    counts = cluster_counts([g[0].shape[0] for g in groups], prunevid_cluster_ratio)
    if sum(counts) > k_f:  # the budget is the cap: shared over the groups by their counts
        counts = split_budget(k_f, counts, counts)
    rows, kept, into = [], [], torch.full((n_v,), -1, dtype=torch.long, device=dev)
    for (y, members, place), c in zip(groups, counts):
        if c == 0:
            continue
        if c >= y.shape[0]:  # not clustered: every row its own
            rows.append(y)
            kept.append(place)
            into = into.index_copy(0, members[:, 1:].reshape(-1), place[:, None].expand_as(members[:, 1:]).reshape(-1))
            continue
        lab, centres = dpc_knn(y, c)
        onehot = (lab[None, :] == torch.arange(c, device=dev)[:, None]).to(torch.float32)  # (c, n)
        rows.append(onehot @ y / onehot.sum(dim=1, keepdim=True))
        kept.append(place[centres])
        owner = place[centres][lab]  # (n,) the kept token of each row's cluster
        into = into.index_copy(0, members.reshape(-1), owner[:, None].expand_as(members).reshape(-1))
    kept_frames = torch.cat(kept)
    all_rows = torch.cat(rows + [visual.to(torch.float32)[free]])
    order = torch.cat([kept_frames, free])
    keep, perm = torch.sort(order)
    into = into.index_fill(0, keep, -1)
    scores = torch.zeros(n_v, dtype=torch.float32, device=dev)
    seg_of_frame = torch.repeat_interleave(torch.arange(len(sizes), device=dev), torch.tensor(sizes, device=dev))
    scores = scores.index_copy(0, frames.reshape(-1), torch.nan_to_num(sims[seg_of_frame]).reshape(-1))
    return Selection(keep=keep, order=order, scores=scores, tokens=all_rows[perm].to(visual.dtype), merged_into=into,
                     extras={"segment": seg_of_frame, "static": static_all.to(dev)[seg_of_frame]})


__all__ = ["cluster_counts", "density_peaks", "dpc_knn", "prunevid_pruner", "refine", "runs", "static_similarity"]
