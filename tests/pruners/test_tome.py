"""ToMe against a restatement of its release (facebookresearch/ToMe, tome/merge.py, `bipartite_soft_matching` and
`merge_wavg`; ModelTC/LightCompress's token_reduction/tome.py calls the same two), written here in plain torch
from the released steps, applied in rounds until K rows remain, on the same inputs."""
from __future__ import annotations

import math

import pytest
import torch

import mipruner
from mipruner.pruners.tome import schedule
from mipruner.testing import meta_default

from ..conftest import TEST_DEVICE


def released_matching(metric: torch.Tensor, r: int, class_token: bool = False, protect: bool = True,
                      argsort=torch.argsort):
    """bipartite_soft_matching on (1, L, d), step by step: (merge(x, mode), unm_idx). With class_token the
    unmerged rows are sorted (its class-token branch); `protect=False` leaves out its -inf on row 0 (the
    visual tokens have no [CLS])."""
    t = metric.shape[1]
    r = min(r, (t - (1 if class_token and protect else 0)) // 2)
    metric = metric / metric.norm(dim=-1, keepdim=True)
    a, b = metric[..., ::2, :], metric[..., 1::2, :]
    scores = a @ b.transpose(-1, -2)
    if class_token and protect:
        scores[..., 0, :] = -math.inf
    node_max, node_idx = scores.max(dim=-1)
    edge_idx = argsort(node_max, dim=-1, descending=True)[..., None]
    unm_idx = edge_idx[..., r:, :]
    src_idx = edge_idx[..., :r, :]
    dst_idx = node_idx[..., None].gather(dim=-2, index=src_idx)
    if class_token:
        unm_idx = unm_idx.sort(dim=1)[0]

    def merge(x, mode="mean"):
        src, dst = x[..., ::2, :], x[..., 1::2, :]
        n, t1, c = src.shape
        unm = src.gather(dim=-2, index=unm_idx.expand(n, t1 - r, c))
        src = src.gather(dim=-2, index=src_idx.expand(n, r, c))
        dst = dst.scatter_reduce(-2, dst_idx.expand(n, r, c), src, reduce=mode)
        return torch.cat([unm, dst], dim=1)
    return merge, unm_idx[0, :, 0]


def released_wavg(merge, x, size):
    x = merge(x * size, mode="sum")
    size = merge(size, mode="sum")
    return x / size, size


def released(x: torch.Tensor, k: int, *, sort_unmerged: bool = True, argsort=torch.argsort, rounds: int = 8):
    """The release's rounds to k rows on x (N, d): (kept indices ascending, rows in that order, sizes, the
    (N,) kept index each token went into). The source matrix as ToMe's `merge_source` (mode "amax"); the index
    a row stands at: an unmerged even row its own, an odd row its own (the release's [unm, dst] order)."""
    n = x.shape[0]
    rows, size = x[None], torch.ones_like(x[None, :, :1])
    source = torch.eye(n, dtype=x.dtype, device=x.device)[None]
    stands = torch.arange(n, device=x.device)
    for r in schedule(n, k, rounds):  # ours: the merges shared over rounds (the release's r per layer)
        merge, unm = released_matching(rows, r, class_token=sort_unmerged, protect=False, argsort=argsort)
        source = merge(source, mode="amax")
        rows, size = released_wavg(merge, rows, size)
        stands = torch.cat([stands[0::2][unm], stands[1::2]])
    keep, perm = torch.sort(stands)
    owner = stands[source[0].argmax(dim=0)]  # each token's row (a 0/1 column: its one 1)
    return keep, rows[0][perm], size[0, perm, 0], owner


def tokens(n: int, d: int, seed: int = 0, dup: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    if dup:  # copies: equal matches (ties of node_max)
        x[1::4] = x[0::4][: x[1::4].shape[0]]
        x[3::4] = x[0::4][: x[3::4].shape[0]]
    return x


CASES = [(48, 16, 24, 8), (48, 16, 7, 8), (50, 8, 1, 8), (37, 12, 20, 3), (64, 32, 3, 1), (9, 4, 5, 2),
         (96, 16, 10, 20)]


def test_schedule():
    assert schedule(576, 64, 8) == [64] * 8 and schedule(100, 100, 8) == []
    assert schedule(48, 7, 1) == [24, 12, 5] and schedule(10, 7, 8) == [1, 1, 1]
    assert sum(schedule(37, 20, 3)) == 17 and schedule(37, 20, 3) == [6, 6, 5]


@pytest.mark.parametrize("n,d,k,rounds", CASES)
@pytest.mark.parametrize("order", ["sequence", "edge"])
def test_equals_the_release(n, d, k, rounds, order):
    x = tokens(n, d, seed=n + k).to(TEST_DEVICE)
    stable = lambda v, dim, descending: torch.sort(v, dim=dim, descending=descending, stable=True).indices  # noqa: E731
    keep, rows, size, owner = released(x, k, sort_unmerged=order == "sequence", argsort=stable, rounds=rounds)
    sel = mipruner.prune("tome", visual=x, budget=k, tome_order=order, tome_rounds=rounds)
    assert sel.keep.tolist() == keep.tolist() and sel.budget == k
    torch.testing.assert_close(sel.tokens, rows, rtol=0, atol=1e-6)  # the same ops, gather against indexing
    assert sel.scores[sel.keep].tolist() == size.tolist() and float(sel.scores.sum()) == n
    want_into = torch.where(owner == torch.arange(n, device=owner.device), -1, owner)
    assert sel.merged_into.tolist() == want_into.tolist()


def test_the_options_change_the_kept_set():
    """Each option is a real choice: on these inputs each one keeps another set (so the tests above tell them apart)."""
    x = tokens(96, 16, seed=106)
    base = mipruner.prune("tome", visual=x, budget=10, tome_rounds=20).keep
    assert not torch.equal(base, mipruner.prune("tome", visual=x, budget=10, tome_rounds=20, tome_order="edge").keep)
    assert not torch.equal(base, mipruner.prune("tome", visual=x, budget=10, tome_rounds=2).keep)
    h = x.to(torch.bfloat16)
    assert not torch.equal(mipruner.prune("tome", visual=h, budget=10, tome_rounds=20).keep,
                           mipruner.prune("tome", visual=h, budget=10, tome_rounds=20, tome_dtype="input").keep)


@pytest.mark.parametrize("n,k", [(48, 10), (40, 25)])
def test_ties_lowest_and_as_released(n, k):
    """Copies tie: "lowest" ranks equal matches by index (a stable sort); "release" is torch.argsort as released
    (on this device's kernel, the restatement's own)."""
    x = tokens(n, 8, seed=3, dup=True).to(TEST_DEVICE)
    stable = lambda v, dim, descending: torch.sort(v, dim=dim, descending=descending, stable=True).indices  # noqa: E731
    assert mipruner.prune("tome", visual=x, budget=k).keep.tolist() == released(x, k, argsort=stable)[0].tolist()
    got = mipruner.prune("tome", visual=x, budget=k, tome_ties="release")
    assert got.keep.tolist() == released(x, k)[0].tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_input_dtype_as_released(dtype):
    """tome_dtype="input": the release's arithmetic in the tokens' dtype, the very same kept set and rows;
    float32 (the default) may keep another set on near-ties, and returns rows in the input dtype too."""
    x = tokens(64, 16, seed=5).to(TEST_DEVICE, dtype)
    stable = lambda v, dim, descending: torch.sort(v, dim=dim, descending=descending, stable=True).indices  # noqa: E731
    keep, rows, _, _ = released(x, 12, argsort=stable)
    sel = mipruner.prune("tome", visual=x, budget=12, tome_dtype="input")
    assert sel.keep.tolist() == keep.tolist() and sel.tokens.dtype == dtype
    torch.testing.assert_close(sel.tokens, rows, rtol=0, atol=0)
    f32 = mipruner.prune("tome", visual=x, budget=12)
    assert f32.tokens.dtype == dtype and f32.keep.numel() == 12


def test_keep_all_and_tokens():
    x = tokens(30, 8)
    sel = mipruner.prune("tome", visual=x, budget=30)
    assert sel.keep.tolist() == list(range(30)) and sel.tokens is None and sel.merged_into is None
    sel = mipruner.prune("tome", visual=x, budget=29)  # one merge: the closest even-odd pair
    a, b = torch.nn.functional.normalize(x[0::2], dim=-1), torch.nn.functional.normalize(x[1::2], dim=-1)
    s = a @ b.T
    i = int(s.max(dim=1).values.argmax())
    j = int(s[i].argmax())
    src, dst = 2 * i, 2 * j + 1
    assert src not in sel.keep.tolist() and int(sel.merged_into[src]) == dst
    row = sel.tokens[sel.keep.tolist().index(dst)]
    torch.testing.assert_close(row, (x[src] + x[dst]) / 2, rtol=0, atol=1e-6)


def test_per_frame_and_registration():
    spec = mipruner.get_pruner("tome")
    assert not spec.adaptive and not spec.video and spec.stage == "projector"
    assert spec.param_names == ("tome_rounds", "tome_order", "tome_ties", "tome_dtype", "per_frame")
    x = tokens(4 * 12, 8, seed=9)
    frame = torch.arange(4).repeat_interleave(12)
    sel = mipruner.prune("tome", visual=x, budget=16, frame_index=frame, per_frame="even")
    assert sel.keep.numel() == 16 and sel.extras["frame_budgets"].tolist() == [4, 4, 4, 4]
    into = sel.merged_into
    assert bool(((into < 0) | (frame[into.clamp(min=0)] == frame)).all())  # merged within its own frame


def test_torch_compile_one_graph():
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    x = tokens(40, 8, seed=2)
    counter = CompileCounter()
    fn = lambda v: mipruner.prune("tome", visual=v, budget=6)  # noqa: E731
    traced = torch.compile(fn, fullgraph=True, backend=counter)(x)
    eager = fn(x)
    assert counter.frame_count == 1 and torch.equal(traced.keep, eager.keep)
    torch.testing.assert_close(traced.tokens, eager.tokens, rtol=0, atol=1e-6)


def test_no_tensor_without_device():
    x = tokens(40, 8, seed=4).to(TEST_DEVICE)
    want = mipruner.prune("tome", visual=x, budget=9)
    with meta_default():
        got = mipruner.prune("tome", visual=x, budget=9)
    assert got.keep.device.type == TEST_DEVICE.type and torch.equal(got.keep, want.keep)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.merged_into, want.merged_into)
