"""PruneVid's pre-LLM stage against a restatement of its release (Visual-AI/PruneVid, models/pllava/modeling_pllava.py,
`merge_frames_dynamic` with `cluster_dpc_knn`, `refine_clusters`, `segment_lengths`, `compute_cluster_vectors`),
written here in plain torch from the released steps (batch 1), without the release's 1e-6 noise on the densities
(random ties) and with its topk as a stable sort where scores tie (`video_inputs.stable_topk`)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mipruner
from mipruner.pruners.prunevid import refine, runs
from mipruner.testing import meta_default

from ..conftest import TEST_DEVICE
from .video_inputs import stable_topk, video_frames, video_tokens


def released_dpc_knn(x: torch.Tensor, cluster_num: int, k: int = 5, topk=stable_topk):
    """cluster_dpc_knn on (1, N, C), step by step (no noise): (idx_cluster (1, N), index_down (1, c))."""
    _, n, c = x.shape
    dist_matrix = torch.cdist(x.float(), x.float()) / (c ** 0.5)
    dist_nearest, _ = topk(dist_matrix, k=min(k, n), dim=-1, largest=False)
    density = (-(dist_nearest ** 2).mean(dim=-1)).exp()
    mask = (density[:, None, :] > density[:, :, None]).type(x.dtype)
    dist_max = dist_matrix.flatten(1).max(dim=-1)[0][:, None, None]
    dist, _ = (dist_matrix * mask + dist_max * (1 - mask)).min(dim=-1)
    score = dist * density
    _, index_down = topk(score, k=max(1, min(cluster_num, n)), dim=-1)
    idx_cluster = dist_matrix[0, index_down[0]][None].argmin(dim=1)
    idx_cluster[0, index_down[0]] = torch.arange(index_down.shape[1], device=x.device)
    return idx_cluster, index_down


def released_cluster_vectors(feats: torch.Tensor, idx: torch.Tensor, num: int) -> torch.Tensor:
    onehot = F.one_hot(idx, num_classes=num).to(feats.dtype)
    sums = torch.bmm(onehot.permute(0, 2, 1), feats)
    counts = onehot.sum(dim=1)
    return sums / counts.clamp(min=1).unsqueeze(-1)


def released(frames: torch.Tensor, table: torch.Tensor, tau=0.8, segment_ratio=0.25, cluster_ratio=0.5):
    """merge_frames_dynamic on frames (T, L, C): (rows (R, C) in the release's order, place (R,) the token index
    (from `table` (T, L)) of each row's centre: a static row's slot in its window's first frame)."""
    t, l, c = frames.shape
    frames = frames[None]
    idx, _ = released_dpc_knn(frames.mean(dim=2), int(t * segment_ratio), k=7)
    windows = runs(released_refine(idx[0].tolist()))  # segment_lengths: the runs (`runs` checked below)
    rows, places = [], []

    def spatial(feat, place):  # spatial_merge_tokens where a group has more than 14 rows
        if feat.shape[1] > 14:
            num = int(feat.shape[1] * cluster_ratio)
            ci, down = released_dpc_knn(feat, num, k=7)
            return released_cluster_vectors(feat, ci, num)[0], place[down[0]]
        return feat[0], place

    start = 0
    for w in windows:
        cur = frames[:, start: start + w]
        normed = F.normalize(cur, p=2, dim=-1)
        sim = torch.einsum("bwlc,btlc->bwtl", normed, normed)
        sim = (sim.sum(dim=-2) - 1).sum(dim=-2) / (w * (w - 1))
        mask = sim > tau  # (1, L)
        m = mask.view(1, 1, l, 1).expand(-1, w, -1, c)
        static = torch.masked_select(cur, m).view(1, w, -1, c).mean(dim=1)
        r, p = spatial(static, table[start][mask[0]])
        rows.append(r)
        places.append(p)
        dynamic = torch.masked_select(cur, ~m).view(1, w, -1, c)
        for i in range(w):
            r, p = spatial(dynamic[:, i], table[start + i][~mask[0]])
            rows.append(r)
            places.append(p)
        start += w
    return torch.cat(rows), torch.cat(places)


CASES = [dict(t=8, n=36, d=16, scenes=(0, 3, 6)), dict(t=8, n=25, d=24, scenes=(0, 4), noise=0.1),
         dict(t=12, n=20, d=16, scenes=(0, 2, 7, 9), noise=0.2), dict(t=4, n=30, d=8, scenes=(0,), noise=0.05),
         dict(t=6, n=16, d=12, scenes=(0, 1, 2, 3, 4, 5))]


@pytest.mark.parametrize("case", CASES)
def test_equals_the_release(case):
    t, n = case["t"], case["n"]
    v = video_tokens(t, n, case["d"], scenes=case["scenes"], noise=case.get("noise", 0.3)).to(TEST_DEVICE)
    fi = video_frames(t, n).to(TEST_DEVICE)
    table = torch.arange(t * n, device=TEST_DEVICE).view(t, n)
    rows, places = released(v.view(t, n, -1), table)
    sel = mipruner.prune("prunevid", visual=v, budget=t * n - 1, frame_index=fi)  # the cap above the release's count
    order = torch.argsort(places)
    assert sel.keep.tolist() == places[order].tolist()
    torch.testing.assert_close(sel.tokens, rows[order], rtol=0, atol=1e-5)  # another summation order (bmm)
    assert sel.keep.numel() < t * n
    # every merged token went into a kept one of its own frame's cluster or its static slot's segment
    into = sel.merged_into
    assert bool(torch.isin(into[into >= 0], sel.keep).all()) and int((into >= 0).sum()) == t * n - sel.keep.numel()


def test_the_cases_cover_static_dynamic_and_clustering():
    """The cases above see static slots and dynamic ones, clustered groups and small ones (so the equality is
    checked on each branch)."""
    seen = set()
    for case in CASES:
        t, n = case["t"], case["n"]
        v = video_tokens(t, n, case["d"], scenes=case["scenes"], noise=case.get("noise", 0.3))
        sel = mipruner.prune("prunevid", visual=v, budget=t * n - 1, frame_index=video_frames(t, n))
        st = sel.extras["static"]
        seen |= {"static"} if bool(st.any()) else set()
        seen |= {"dynamic"} if bool((~st).any()) else set()
        seen |= {"segments"} if int(sel.extras["segment"].max()) > 0 else set()
    assert seen == {"static", "dynamic", "segments"}


def released_refine(cluster_idx: list[int]) -> list[int]:
    """refine_clusters on one sequence, step by step as released (three passes)."""
    n = len(cluster_idx)
    out = list(cluster_idx)
    info = {}
    for lab in sorted(set(cluster_idx)):
        ind = [i for i, x in enumerate(cluster_idx) if x == lab]
        segs, start, prev = [], ind[0], ind[0]
        for i in ind[1:]:
            if i == prev + 1:
                prev = i
            else:
                segs.append((start, prev))
                start = prev = i
        segs.append((start, prev))
        info[lab] = segs
    for lab, segs in info.items():
        longest = max(e - s + 1 for s, e in segs)
        if longest == 1:
            for s, e in segs:
                out[s: e + 1] = [-1] * (e - s + 1)
            continue
        for s, e in segs:
            if e - s + 1 != longest:
                out[s: e + 1] = [-1] * (e - s + 1)
    i = 0
    while i < n:
        if out[i] == -1:
            s = i
            while i < n and out[i] == -1:
                i += 1
            e = i - 1
            ll, lr, left, right = 0, 0, None, None
            if s > 0:
                left = out[s - 1]
                j = s - 1
                while j >= 0 and out[j] == left:
                    j -= 1
                ll = s - j - 1
            if e < n - 1:
                right = out[e + 1]
                j = e + 1
                while j < n and out[j] == right:
                    j += 1
                lr = j - e - 1
            new = left if ll > lr else right if lr > ll else (left if left is not None else right)
            out[s: e + 1] = [0 if new is None else new] * (e - s + 1)
        else:
            i += 1
    return out


@pytest.mark.parametrize("labels", [[0, 0, 1, 1, 0, 1, 1, 1], [2, 2, 2, 2], [0, 1, 0, 1], [1, 0, 0, 1, 1, 2, 2, 2, 0],
                                    [3, 3, 1, 3, 3, 0, 0], [0, 0, 1, 0, 0, 1, 1, 2], [1, 2, 3]])
def test_refine_is_the_releases_rules(labels):
    got = refine(labels)
    assert got == released_refine(labels)
    bounds = [i for i in range(1, len(got)) if got[i] != got[i - 1]]
    assert runs(got) == [b - a for a, b in zip([0] + bounds, bounds + [len(got)])]


def test_refine_examples():
    assert refine([0, 0, 1, 0, 0, 1, 1, 2]) == [0, 0, 0, 0, 0, 1, 1, 1]  # both longest runs of 0 stay
    assert refine([1, 2, 3]) == [0, 0, 0]  # every cluster a single frame: all relabelled, 0 with no neighbour


def test_budget_is_the_cap_and_keep_all():
    t, n = 8, 36
    v = video_tokens(t, n, 16, scenes=(0, 3, 6))
    fi = video_frames(t, n)
    free = mipruner.prune("prunevid", visual=v, budget=t * n - 1, frame_index=fi).keep.numel()
    for k in (10, 40, free - 1):
        sel = mipruner.prune("prunevid", visual=v, budget=k, frame_index=fi)
        assert sel.keep.numel() == k and sel.tokens.shape[0] == k
    assert mipruner.prune("prunevid", visual=v, budget=free + 5, frame_index=fi).keep.numel() == free
    sel = mipruner.prune("prunevid", visual=v, budget=t * n, frame_index=fi)
    assert sel.keep.tolist() == list(range(t * n)) and sel.tokens is None
    spec = mipruner.get_pruner("prunevid")
    assert spec.video and spec.adaptive and "per_frame" not in spec.param_names


def test_newline_of_no_frame_is_kept_and_one_frame_is_a_sentence():
    t, n = 6, 20
    v = torch.cat([video_tokens(t, n, 12, scenes=(0, 3)), torch.randn(1, 12)])
    fi = video_frames(t, n, newline=True)
    sel = mipruner.prune("prunevid", visual=v, budget=30, frame_index=fi)
    assert int(sel.keep[-1]) == t * n and sel.keep.numel() == 30
    torch.testing.assert_close(sel.tokens[-1], v[-1])
    with pytest.raises(ValueError, match="1 frame"):
        mipruner.prune("prunevid", visual=v[:-1], budget=7)


def test_no_tensor_without_device():
    t, n = 8, 20
    v = video_tokens(t, n, 12, scenes=(0, 4)).to(TEST_DEVICE)
    fi = video_frames(t, n).to(TEST_DEVICE)
    want = mipruner.prune("prunevid", visual=v, budget=50, frame_index=fi)
    with meta_default():
        from mipruner.pruners import video
        video._TABLES.clear()
        got = mipruner.prune("prunevid", visual=v, budget=50, frame_index=fi)
    assert got.keep.device.type == TEST_DEVICE.type and torch.equal(got.keep, want.keep)
    assert torch.equal(got.tokens, want.tokens)
