"""HoliTom, its pre-LLM stage (Shao et al., "HoliTom: Holistic Token Merging for Fast Video Large Language Models",
arXiv:2505.21334): the video cut into the windows that save the most static tokens (a dynamic program over frames),
each window's static tokens averaged over time and merged by density peaks, each frame's dynamic tokens the most
attended ones (and, with D > 0, density-peak merges of the rest).

Original: cokeshao/HoliTom, `holitom/llava_arch.py`, `LlavaMetaForCausalLM.prepare_inputs_labels_for_multimodal`
(the video branch) with `select_static_windows`, `get_static_dynamic_features`, `holitom`,
`merge_tokens_by_attention_density`, `merge_tokens_by_density`, `merge_tokens_by_clustering` and `cluster_dpc_knn`
(ModelTC/LightCompress ships it as `llmc/compression/token_reduction/holitom.py`, class `HoliTom`); defaults from
its README: T (tau) 0.8, BETA 0.6, D 0, K 7, MAX_WINDOW_SIZE 1024; its RETAIN_RATIO is our K_f / (T P).

    frames X (T, P, d) (`video.frame_slots`), attention a (T, P) (`attention.attention_scores`)
    similarity  s[t, p] = cos(x[t, p], x[t + 1, p]), t < T - 1
    windows     saved[i, j] = (j - i) #{p : s[i..j-1, p] > tau all}  (a window of frames i..j keeps one row per
                static slot); the dynamic program over frames: best[i] = max(best[i - 1], max over window sizes
                w in 2..min(i + 1, max) of best[i - w] + saved[i - w + 1, i]) (strictly greater to move; the
                smallest w first), windows read back from the last frame; R = best[T - 1]
    ratio       r = min(1, K_f / (T P - R))
    static      in a window of 2+ frames, slot p is static where s[i..j-1, p] > tau all; one row per static slot,
                its mean over the window's frames; merge_tokens_by_density: c = round(S r) centres by DPC-KNN
                (k = min(7, c)), in index order; each other row joins its nearest centre (cdist, the first on
                ties) and a centre with members := beta centre + (1 - beta) mean(members)
    dynamic     each frame of the window, its non-static slots (a one-frame window: all of them): D' = round(
                ceil(n r) (1 - D)) most attended kept as they are, C = ceil(n r) - D' centres by DPC-KNN among the
                others (k = min(7, C)), merged as above
    DPC-KNN     rho = exp(-mean squared distance to the k nearest, itself included) (cdist / sqrt(d)); delta =
                distance to the nearest denser row (the largest distance when none); centres = the c of largest
                delta rho

Here every row sits at its own token (a static row: its slot in the window's first frame, as the release's grid
layout places static rows in the first frame), so keep = those tokens in index order, tokens = their rows, and
merged_into = for every token merged into a row (a static slot's W tokens, a cluster's members) its kept token;
the dynamic tokens neither kept nor merged (D = 0: every unattended one) are dropped (-1). The release keeps
sum(round(S r)) + sum(ceil(n r)) tokens, which rounding can put above K_f: the method is adaptive, the budget its
cap: where the count exceeds K_f, r is lowered (host arithmetic, the largest r whose count fits); under one token
a frame with dynamic tokens (the release keeps at least one each) the K_f most attended frame tokens are kept
(ATS alone, as FastVID's fallback). Tokens of no
frame (OneVision's newline after the video) are kept; the frames share K_f = K - M. K = N_V keeps every token.

Not expressed: HoliTom's inner-LLM merging (HOLITOM_k, HOLITOM_r: at a layer, the visual tokens most alike merged
into their neighbours inside the LLM); `holitom` is the pre-LLM stage alone.

Deliberate deviations: the release adds uniform noise of 1e-6 to rho (random ties), here none; top-k choices break
ties to the lower index (stable sorts; the release's torch.topk leaves them to the kernel); ATS ranks by the
encoder attention the attention methods read (the release: SigLIP's last-layer attention averaged over heads and
queries, pooled as the features); the rows enter the LLM at their tokens' places, not the release's new sequence
(each window's static rows, then its frames' dynamic rows, with OneVision's row newlines); computed in float32,
returned in `visual`'s dtype. Cost: O(T^2 P) for the windows, O(n^2 d) a clustered group; one host read (the
windows' static slots), then host-sized groups: it runs eagerly.
"""
from __future__ import annotations

import math

import torch

from ._registry import Param, register_pruner
from .attention import attention_scores
from .capture import Capturable
from .selection import Selection, top_indices
from .prunevid import density_peaks
from .vidcom2 import video_frames

NEIGHBOURS = 7  # release: K = 7


def static_runs(sim: torch.Tensor, tau: float) -> torch.Tensor:
    """(T, T, P) bool: [i, j, p] = slot p is static over frames i..j (s[i..j-1, p] > tau all; False for j <= i)."""
    t1, p = sim.shape
    t = t1 + 1
    above = sim > tau  # (T - 1, P)
    out = torch.zeros(t, t, p, dtype=torch.bool, device=sim.device)
    for i in range(t - 1):  # frames, not tokens: T - 1 cumulative products on the device
        out[i, i + 1:] = torch.cumprod(above[i:].to(torch.int8), dim=0).bool()
    return out


def select_windows(saved: list[list[int]], t: int, max_window: int) -> tuple[list[tuple[int, int]], int]:
    """The release's `select_static_windows` on host counts saved[i][j]: ((start, end) windows in order, R)."""
    best = [0] * t
    prev = [0] * t
    for i in range(t):
        value = best[i - 1] if i > 0 else 0
        start = i
        for w in range(2, min(i + 1, max_window) + 1):
            j = i - w
            cur = (best[j] if j >= 0 else 0) + saved[j + 1][i]
            if cur > value:
                value, start = cur, j + 1
        best[i], prev[i] = value, start
    out, i = [], t - 1
    while i >= 0:
        out.append((prev[i], i))
        i = prev[i] - 1
    return out[::-1], best[-1]


def dpc_centres(y: torch.Tensor, c: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(centres (c,) rows in index order, dist (n, n)) by DPC-KNN (module docstring) of rows y (n, d), float32."""
    score, dist = density_peaks(y, k)
    return torch.sort(top_indices(score, c)).values, dist


def cluster_merge(y: torch.Tensor, centres: torch.Tensor, dist: torch.Tensor, beta: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(merged rows (c, d), owner (n,) the centre slot of each row) for rows y (n, d): each non-centre row joins its
    nearest centre, a centre with members := beta centre + (1 - beta) mean(members) (`merge_tokens_by_clustering`)."""
    n, c = y.shape[0], centres.numel()
    owner = dist[:, centres].argmin(dim=1)  # (n,)
    is_centre = torch.zeros(n, dtype=torch.bool, device=y.device).index_fill(0, centres, True)
    owner = owner.masked_fill(is_centre, -1).index_copy(0, centres, torch.arange(c, device=y.device))
    member = (~is_centre)[None, :] & (owner[None, :] == torch.arange(c, device=y.device)[:, None])  # (c, n)
    count = member.sum(dim=1, keepdim=True).to(y.dtype)
    mean = (member.to(y.dtype) @ y) / count.clamp(min=1)
    rows = torch.where(count > 0, beta * y[centres] + (1 - beta) * mean, y[centres])
    return rows, owner


def counts_at(ratio: float, groups: list[tuple[str, int]], share: float) -> list[tuple[int, int]]:
    """(kept as they are, centres) of each group ("static", S) / ("dynamic", n) at retain ratio `ratio`, as the
    release rounds them: static round(S r) centres; dynamic D' = round(ceil(n r) (1 - D)) and ceil(n r) - D'."""
    out = []
    for kind, n in groups:
        if kind == "static":
            out.append((0, round(n * ratio)))
        else:
            total = math.ceil(n * ratio)
            dominant = round(total * (1 - share))
            out.append((dominant, total - dominant))
    return out


def fitted_ratio(ratio: float, groups: list[tuple[str, int]], share: float, cap: int) -> float:
    """`ratio` when its count fits `cap`, else the largest ratio below it whose count does (bisection, host)."""
    total = lambda r: sum(a + b for a, b in counts_at(r, groups, share))  # noqa: E731
    if total(ratio) <= cap:
        return ratio
    lo, hi = 0.0, ratio
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) <= cap else (lo, mid)
    return lo


@register_pruner("holitom", stage="vision", needs=("attention",), adaptive=True, video=True, label="HoliTom (video)",
                 capture=Capturable(when=lambda n_v, params: False),  # its windows are read on the host: eager
                 score_label="attention share", params=(
    Param.real("holitom_tau", 0.8, -1.0, 1.0, "HoliTom T: a slot is static over frames whose consecutive cosines are "
               "all above it", step=0.05),
    Param.real("holitom_beta", 0.6, 0.0, 1.0, "HoliTom BETA: a merged centre's own weight", step=0.05),
    Param.real("holitom_dynamic_share", 0.0, 0.0, 1.0, "HoliTom D: share of a frame's dynamic budget given to merged "
               "density-peak centres (0: the most attended tokens alone)", high_open=True, step=0.05),
    Param.integer("holitom_max_window", 1024, 2, None, "HoliTom MAX_WINDOW_SIZE: most frames in one static window")))
def holitom_pruner(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *,
                   attention: torch.Tensor | None = None,
                   keys: torch.Tensor | None = None,  # unused; every attention pruner takes the same inputs
                   frame_index: torch.Tensor | None = None, holitom_tau: float = 0.8, holitom_beta: float = 0.6,
                   holitom_dynamic_share: float = 0.0, holitom_max_window: int = 1024) -> Selection:
    """HoliTom: static windows by a dynamic program, static tokens merged in time and space, dynamic ones by attention."""
    n_v, dev = visual.shape[0], visual.device
    attn = attention_scores(attention, n_v, method="holitom").to(dev)  # (N_V,)
    frames, free = video_frames(frame_index, n_v, dev, "HoliTom")  # (T, P), (M,)
    if budget >= n_v:  # keep-all: the unpruned input
        return Selection.from_order(torch.arange(n_v, device=dev), attn)
    k_f = budget - free.numel()
    if k_f <= 0:  # the budget does not reach the frames: the first K tokens of no frame
        return Selection.from_order(free[:budget], attn)
    t, p = frames.shape
    x = visual.to(torch.float32)[frames]  # (T, P, d)
    a = attn[frames]  # (T, P)
    u = torch.nn.functional.normalize(x, p=2, dim=-1)  # the release normalises, then takes the cosine
    sim = torch.nn.functional.cosine_similarity(u[:-1], u[1:], dim=-1)  # (T - 1, P)
    runs = static_runs(sim, holitom_tau).cpu()  # the one host read: (T, T, P) bool
    span = torch.arange(t, device="cpu")
    saved = (runs.sum(dim=-1) * (span[None, :] - span[:, None]).clamp(min=0)).tolist()  # (T, T) host ints
    windows, reduced = select_windows(saved, t, holitom_max_window)
    groups, plan = [], []  # host sizes; (kind, frame or window, slots)
    for s, e in windows:
        static = runs[s, e] if e > s else torch.zeros(p, dtype=torch.bool, device="cpu")
        st = torch.nonzero(static).flatten()
        dy = torch.nonzero(~static).flatten()
        groups.append(("static", st.numel()))
        plan.append(("static", (s, e), st))
        for f in range(s, e + 1):
            groups.append(("dynamic", dy.numel()))
            plan.append(("dynamic", f, dy))
    ratio = fitted_ratio(min((k_f / (t * p)) / ((t * p - reduced) / (t * p)), 1), groups, holitom_dynamic_share, k_f)
    counts = counts_at(ratio, groups, holitom_dynamic_share)
    if k_f < sum(n > 0 for kind, n in groups if kind == "dynamic") or sum(a + b for a, b in counts) == 0:
        # under one token a frame with dynamic tokens (the release keeps at least one each): ATS alone
        flat = frames.reshape(-1)
        order = torch.cat([flat[top_indices(attn[flat], k_f)], free])
        return Selection.from_order(order, attn, merged_into=torch.full((n_v,), -1, dtype=torch.long, device=dev),
                                    extras={"segment": torch.zeros(t, dtype=torch.long, device=dev)})
    rows, kept, into = [], [], torch.full((n_v,), -1, dtype=torch.long, device=dev)
    for (kind, where, slots), (dominant, centres_n) in zip(plan, counts):
        slots = slots.to(dev)
        if kind == "static":
            s, e = where
            if centres_n == 0 or slots.numel() == 0:
                continue
            y = x[s: e + 1].index_select(1, slots).mean(dim=0)  # (S, d)
            place = frames[s].index_select(0, slots)  # (S,) the first frame's tokens
            centres, dist = dpc_centres(y, centres_n, min(NEIGHBOURS, centres_n))
            merged, owner = cluster_merge(y, centres, dist, holitom_beta)
            rows.append(merged)
            kept.append(place[centres])
            members = frames[s: e + 1].index_select(1, slots)  # (W, S) every token of each static slot
            into = into.index_copy(0, members.reshape(-1), place[centres][owner].expand(e - s + 1, -1).reshape(-1))
            continue
        f = where
        if slots.numel() == 0 or dominant + centres_n == 0:
            continue
        own = frames[f].index_select(0, slots)  # (n,)
        y, score = x[f].index_select(0, slots), a[f].index_select(0, slots)
        top = torch.sort(top_indices(score, dominant)).values
        rows.append(y[top])
        kept.append(own[top])
        if centres_n > 0:
            rest = torch.ones(slots.numel(), dtype=torch.bool, device=dev).index_fill(0, top, False)
            rest = torch.argsort((~rest).to(torch.int8), stable=True)[: slots.numel() - dominant]  # ascending
            centres, dist = dpc_centres(y[rest], centres_n, min(NEIGHBOURS, centres_n))
            merged, owner = cluster_merge(y[rest], centres, dist, holitom_beta)
            rows.append(merged)
            kept.append(own[rest][centres])
            into = into.index_copy(0, own[rest], own[rest][centres][owner])
    kept_frames = torch.cat(kept)
    order = torch.cat([kept_frames, free])
    keep, perm = torch.sort(order)
    into = into.index_fill(0, keep, -1)
    all_rows = torch.cat(rows + [visual.to(torch.float32)[free]])
    window_of = torch.zeros(t, dtype=torch.long, device="cpu")  # host: T ints
    for i, (s, e) in enumerate(windows):
        window_of[s: e + 1] = i
    return Selection(keep=keep, order=order, scores=attn, tokens=all_rows[perm].to(visual.dtype), merged_into=into,
                     extras={"segment": window_of.to(dev),
                             "retain_ratio": torch.tensor(ratio, dtype=torch.float64, device=dev)})


__all__ = ["cluster_merge", "counts_at", "dpc_centres", "fitted_ratio", "holitom_pruner", "select_windows",
           "static_runs"]
