"""HoliTom's pre-LLM stage against a restatement of its release (cokeshao/HoliTom, holitom/llava_arch.py: the video
branch of `prepare_inputs_labels_for_multimodal`, `select_static_windows`, `get_static_dynamic_features`,
`holitom`, `merge_tokens_by_attention_density`, `merge_tokens_by_density`, `merge_tokens_by_clustering`,
`cluster_dpc_knn`), written here in plain torch from the released steps (one video, no row newlines), without the
release's 1e-6 noise on the densities and with its topk as a stable sort where scores tie."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import mipruner
from mipruner.pruners.attention import attention_scores
from mipruner.testing import meta_default

from ..conftest import TEST_DEVICE
from .video_inputs import attention, stable_topk, video_frames


def released_dpc(x, cluster_num, k=7):
    """cluster_dpc_knn on (1, n, d): (index_center (1, c), dist_matrix (1, n, n))."""
    dist_matrix = torch.cdist(x.float(), x.float()) / (x.shape[-1] ** 0.5)
    dist_nearest, _ = stable_topk(dist_matrix, k, dim=-1, largest=False)
    density = (-(dist_nearest ** 2).mean(dim=-1)).exp()
    mask = (density[:, None, :] > density[:, :, None]).type(x.dtype)
    dist_max = dist_matrix.flatten(1).max(dim=-1).values[:, None, None]
    dist, _ = (dist_matrix * mask + dist_max * (1 - mask)).min(dim=-1)
    _, index_center = stable_topk(dist * density, cluster_num, dim=-1)
    return index_center, dist_matrix


def released_select_windows(feature_sim, t, tau, max_window_size):
    count = torch.zeros((t, t))
    for start in range(t):
        for end in range(start + 1, t):
            count[start, end] = torch.all(feature_sim[start:end, :] > tau, dim=0).sum().item() * (end - start)
    dp = torch.zeros(t)
    prev = torch.zeros(t, dtype=torch.long)
    for i in range(t):
        max_val = dp[i - 1] if i > 0 else 0
        best_j = i
        for w in range(2, min(i + 1, max_window_size) + 1):
            j = i - w
            cur = (dp[j] if j >= 0 else 0) + count[j + 1, i]
            if cur > max_val:
                max_val, best_j = cur, j + 1
        dp[i] = max_val
        prev[i] = best_j
    out, i = [], t - 1
    while i >= 0:
        out.append((prev[i].item(), i))
        i = prev[i].item() - 1
    return out[::-1], dp[-1].item()


def released_clustering(feat, target, dist_matrix, cluster_num, beta):
    seq_len = feat.shape[1]
    non_target = torch.arange(seq_len)[~torch.isin(torch.arange(seq_len), target[0])][None]
    non_feat = feat[0, non_target[0]][None]
    dist = dist_matrix[0][non_target[0]][:, target[0]][None]
    idx = torch.argmin(dist, dim=-1)
    tokens = []
    for i in range(cluster_num):
        m = idx[0] == i
        if m.any():
            tokens.append(beta * feat[0][target[0][i]] + (1 - beta) * non_feat[0][m].mean(dim=0))
        else:
            tokens.append(feat[0][target[0][i]])
    return torch.stack(tokens)[None]


def released_attention_density(feat, attn, pos, r, d_share, beta, k):
    """merge_tokens_by_attention_density on (W, n, d): (rows, positions) per frame, as lists."""
    w, n, _ = feat.shape
    dominant = round(math.ceil(n * r) * (1 - d_share))
    contextual = math.ceil(n * r) - dominant
    rows, places = [], []
    for b in range(w):
        idx = stable_topk(attn[b], dominant).indices if dominant > 0 else torch.zeros(0, dtype=torch.long)
        keepmask = torch.zeros(n, dtype=torch.bool).index_fill(0, idx, True)
        rows.append(feat[b][keepmask])
        places.append(pos[b][keepmask])
        if contextual > 0:
            filt = feat[b][~keepmask][None]
            cpos = pos[b][~keepmask]
            target, dist = released_dpc(filt, contextual, k=min(k, contextual))
            target = torch.sort(target, dim=-1)[0]
            rows.append(released_clustering(filt, target, dist, contextual, beta)[0])
            places.append(cpos[target[0]])
    return rows, places


def released(frames, attn, table, retain_ratio, tau=0.8, beta=0.6, d_share=0.0, k=7, max_window=1024, fitted=None):
    """The video branch on frames (T, P, d) and attention (T, P): (rows (R, d), place (R,) from `table` (T, P)).
    `fitted`: the ratio after the static windows, given (ours, where the release's count is above the budget)."""
    t, p, _ = frames.shape
    normed = F.normalize(frames, p=2, dim=-1)
    sim = F.cosine_similarity(normed[:-1], normed[1:], dim=-1)
    windows, reduced = released_select_windows(sim, t, tau, max_window)
    total = t * p
    r = min(retain_ratio / ((total - reduced) / total), 1) if fitted is None else fitted
    rows, places = [], []
    for s, e in windows:
        if s == e:
            mask = torch.zeros(p, dtype=torch.bool)
        else:
            mask = torch.all(sim[s:e, :] > tau, dim=0)
            static = frames[s: e + 1, mask].mean(dim=0)
            cluster_num = round(static.shape[0] * r)
            if cluster_num > 0:
                target, dist = released_dpc(static[None], cluster_num, k=min(k, cluster_num))
                target = torch.sort(target, dim=-1)[0]
                rows.append(released_clustering(static[None], target, dist, cluster_num, beta)[0])
                places.append(table[s][mask][target[0]])
        dyn_rows, dyn_places = released_attention_density(frames[s: e + 1, ~mask], attn[s: e + 1, ~mask],
                                                          table[s: e + 1][:, ~mask], r, d_share, beta, k)
        rows += dyn_rows
        places += dyn_places
    return torch.cat(rows), torch.cat(places)


def clip(t: int, n: int, d: int, *, scenes=(0,), moving: float = 0.3, noise: float = 0.05, seed: int = 0):
    """(T n, d): per scene a base frame; each frame adds small noise, and a `moving` share of slots is redrawn in
    every frame (dynamic), so windows hold static and dynamic slots."""
    g = torch.Generator().manual_seed(seed)
    out, base = [], None
    moving_slots = torch.rand(n, generator=g) < moving
    for f in range(t):
        if f in scenes or base is None:
            base = torch.randn(n, d, generator=g)
        x = base + noise * torch.randn(n, d, generator=g)
        x[moving_slots] = torch.randn(int(moving_slots.sum()), d, generator=g)
        out.append(x)
    return torch.cat(out)


CASES = [dict(t=8, n=36, d=16, scenes=(0, 3, 6)), dict(t=6, n=30, d=12, scenes=(0, 2), moving=0.5),
         dict(t=10, n=20, d=16, scenes=(0, 5), moving=0.2, max_window=3), dict(t=5, n=25, d=8, scenes=(0, 1, 2, 3, 4))]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("d_share", [0.0, 0.5])
def test_equals_the_release_where_its_count_fits(case, d_share):
    t, n = case["t"], case["n"]
    v = clip(t, n, case["d"], scenes=case["scenes"], moving=case.get("moving", 0.3), seed=t)
    att = attention(t * n, seed=t)
    fi = video_frames(t, n)
    a = attention_scores(att, t * n).view(t, n)
    table = torch.arange(t * n).view(t, n)
    mw = case.get("max_window", 1024)
    matched = 0
    for k in (t * n // 10, t * n // 4, t * n // 2, t * n - 1):
        rows, places = released(v.view(t, n, -1), a, table, k / (t * n), d_share=d_share, max_window=mw)
        sel = mipruner.prune("holitom", visual=v.to(TEST_DEVICE), budget=k, frame_index=fi.to(TEST_DEVICE),
                             attention=att.to(TEST_DEVICE), holitom_dynamic_share=d_share, holitom_max_window=mw)
        assert 1 <= sel.keep.numel() <= k
        if places.numel() <= k:  # the release's count fits: its very selection
            matched += 1
        else:  # over the cap: the release at the largest ratio whose count fits
            rows, places = released(v.view(t, n, -1), a, table, k / (t * n), d_share=d_share, max_window=mw,
                                    fitted=float(sel.extras["retain_ratio"]))
            assert places.numel() <= k
        order = torch.argsort(places)
        assert sel.keep.cpu().tolist() == places[order].tolist(), k
        torch.testing.assert_close(sel.tokens.cpu(), rows[order], rtol=0, atol=1e-5)
    # the release's own count fits at least the budget N_V - 1, unless every frame is a window of its own (then
    # ceil(n r) = n a frame at r = (N_V - 1) / N_V, above the cap at every budget here)
    assert matched >= 1 or int(sel.extras["segment"].max()) == t - 1


def test_the_cases_see_static_windows_and_dynamic_tokens():
    seen = set()
    for case in CASES:
        t, n = case["t"], case["n"]
        v = clip(t, n, case["d"], scenes=case["scenes"], moving=case.get("moving", 0.3), seed=t)
        sel = mipruner.prune("holitom", visual=v, budget=t * n // 4, frame_index=video_frames(t, n),
                             attention=attention(t * n, seed=t), holitom_max_window=case.get("max_window", 1024))
        seg = sel.extras["segment"]
        seen |= {"window"} if int(torch.bincount(seg).max()) > 1 else set()
        seen |= {"single"} if int(torch.bincount(seg).min()) == 1 else set()
        seen |= {"merged"} if bool((sel.merged_into >= 0).any()) else set()
        seen |= {"dropped"} if int((sel.merged_into >= 0).sum()) + sel.keep.numel() < t * n else set()
    assert seen == {"window", "single", "merged", "dropped"}


def test_windows_dynamic_program():
    from mipruner.pruners.holitom import select_windows
    # 4 frames: frames 0-2 alike on 5 slots, frame 3 new
    saved = [[0, 5, 10, 0], [0, 0, 5, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert select_windows(saved, 4, 1024) == ([(0, 2), (3, 3)], 10)
    assert select_windows(saved, 4, 2) == ([(0, 1), (2, 2), (3, 3)], 5)


def test_budget_is_the_cap_keep_all_and_newline():
    t, n = 6, 20
    v = clip(t, n, 12, scenes=(0, 3))
    att = attention(t * n + 1)
    fi = video_frames(t, n, newline=True)
    v1 = torch.cat([v, torch.randn(1, 12)])
    for k in (7, 30, 60, 119):
        sel = mipruner.prune("holitom", visual=v1, budget=k, frame_index=fi, attention=att)
        assert 1 <= sel.keep.numel() <= k and int(sel.keep[-1]) == t * n  # the newline kept
    sel = mipruner.prune("holitom", visual=v1, budget=t * n + 1, frame_index=fi, attention=att)
    assert sel.keep.tolist() == list(range(t * n + 1)) and sel.tokens is None
    with pytest.raises(ValueError, match="1 frame"):
        mipruner.prune("holitom", visual=v, budget=7, attention=attention(t * n))
    spec = mipruner.get_pruner("holitom")
    assert spec.video and spec.adaptive and spec.stage == "vision" and "per_frame" not in spec.param_names


def test_no_tensor_without_device():
    t, n = 6, 20
    v = clip(t, n, 12, scenes=(0, 3)).to(TEST_DEVICE)
    att = attention(t * n).to(TEST_DEVICE)
    fi = video_frames(t, n).to(TEST_DEVICE)
    want = mipruner.prune("holitom", visual=v, budget=40, frame_index=fi, attention=att, holitom_dynamic_share=0.5)
    with meta_default():
        from mipruner.pruners import video
        video._TABLES.clear()
        got = mipruner.prune("holitom", visual=v, budget=40, frame_index=fi, attention=att, holitom_dynamic_share=0.5)
    assert got.keep.device.type == TEST_DEVICE.type and torch.equal(got.keep, want.keep)
    assert torch.equal(got.tokens, want.tokens)


def test_under_one_token_a_dynamic_frame_keeps_the_most_attended():
    t, n = 5, 25
    v = clip(t, n, 8, scenes=(0, 1, 2, 3, 4))  # every frame new: every slot dynamic, one window a frame
    att = attention(t * n, seed=2)
    sel = mipruner.prune("holitom", visual=v, budget=3, frame_index=video_frames(t, n), attention=att)
    want = torch.sort(attention_scores(att, t * n), descending=True, stable=True).indices[:3]
    assert sel.keep.tolist() == sorted(want.tolist()) and sel.tokens is None
