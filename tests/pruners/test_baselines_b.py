"""Vision-encoder-attention pruners: attention, visionzip, vispruner, mi_attention.

Expected values are worked out by hand (or with an independent few-line computation) on tiny inputs,
never copied from the implementation.
"""
import pytest
import torch

import mipruner
from mipruner.pruners.visionzip import dominant_count

ENCODER_METHODS = ["attention", "visionzip", "vispruner", "mi_attention"]


def rand_inputs(n=20, d=8, n_t=4, cls=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = n + 1 if cls else n
    return dict(visual=torch.randn(n, d, generator=g), text=torch.randn(n_t, d, generator=g),
                attention=torch.softmax(torch.randn(m, m, generator=g) * 3, dim=-1),
                keys=torch.randn(m, 6, generator=g))


# ----------------------------------------------------------------------------------------- attention

def test_attention_with_cls_uses_cls_row():
    a = torch.zeros(4, 4)
    a[0, 1:] = torch.tensor([0.1, 0.5, 0.2])  # [CLS] -> patches 0, 1, 2
    a[1:, 1] = 0.9  # patch 0 receives a lot from the other patches: must not matter with [CLS]
    sel = mipruner.prune("attention", visual=torch.randn(3, 2), budget=2, attention=a)
    assert sel.keep.tolist() == [1, 2] and sel.order.tolist() == [1, 2]
    assert torch.allclose(sel.scores, torch.tensor([0.1, 0.5, 0.2]))


def test_attention_without_cls_column_sum_excludes_diagonal():
    a = torch.tensor([[0.9, 0.05, 0.05],
                      [0.1, 0.1, 0.8],
                      [0.3, 0.3, 0.4]])
    # received from the others: col0 = 0.1 + 0.3, col1 = 0.05 + 0.3, col2 = 0.05 + 0.8.
    # With the diagonal, token 0 would win (1.3 > 1.25).
    sel = mipruner.prune("attention", visual=torch.randn(3, 2), budget=1, attention=a)
    assert sel.keep.tolist() == [2]
    assert torch.allclose(sel.scores, torch.tensor([0.4, 0.35, 0.85]))


def test_attention_use_cls_false_and_true():
    a = torch.zeros(4, 4)
    a[0, 1:] = torch.tensor([0.7, 0.2, 0.1])  # [CLS] prefers patch 0
    a[1:, 1:] = torch.tensor([[0.5, 0.1, 0.4],
                              [0.0, 0.9, 0.1],
                              [0.0, 0.1, 0.9]])  # image block: col sums w/o diag = 0, 0.2, 0.5
    a[0, 0] = 5.0  # [CLS] row/col must not leak into the column sum
    a[1:, 0] = 5.0
    sel = mipruner.prune("attention", visual=torch.randn(3, 2), budget=1, attention=a, use_cls=False)
    assert sel.keep.tolist() == [2]
    assert torch.allclose(sel.scores, torch.tensor([0.0, 0.2, 0.5]))
    assert mipruner.prune("attention", visual=torch.randn(3, 2), budget=1, attention=a).keep.tolist() == [0]
    with pytest.raises(ValueError, match="use_cls=True"):
        mipruner.prune("attention", visual=torch.randn(3, 2), budget=1, attention=a[1:, 1:], use_cls=True)


# ----------------------------------------------------------------------------------------- visionzip

def test_visionzip_merge_by_hand():
    v = torch.arange(6 * 3, dtype=torch.float32).reshape(6, 3) ** 1.5  # distinct rows
    a = torch.full((7, 7), 0.1)
    a[0, 1:] = torch.tensor([0.05, 0.1, 0.4, 0.15, 0.2, 0.1])  # dominant (D = 1): token 2
    # rest = [0, 1, 3, 4, 5], C = 2 targets at stride 5 // 2 = 2 -> positions 0, 2 -> tokens 0, 3
    k = torch.zeros(7, 2)
    k[1 + 0] = torch.tensor([10.0, 0.0])  # target 0
    k[1 + 3] = torch.tensor([0.0, 1.0])  # target 3
    k[1 + 1] = torch.tensor([0.1, 2.0])  # -> target 3
    k[1 + 4] = torch.tensor([3.0, 0.5])  # -> target 0
    k[1 + 5] = torch.tensor([1.0, 1.2])  # dot product says target 0, cosine says target 3
    k[1 + 2] = torch.tensor([5.0, 5.0])  # dominant: its key is irrelevant
    sel = mipruner.prune("visionzip", visual=v, budget=3, attention=a, keys=k, dominant_ratio=1 / 3)
    assert sel.keep.tolist() == [0, 2, 3]
    assert sel.order.tolist()[0] == 2  # dominant first
    expected = torch.stack([v[0] + v[4], v[2], v[3] + (v[1] + v[5]) / 2])
    assert sel.tokens.shape == (3, 3)
    assert torch.allclose(sel.tokens, expected)
    assert sel.extras["merged_into"].tolist() == [0, 3, 2, 3, 0, 3]


def test_visionzip_dominant_are_top_cls_attention():
    kw = rand_inputs(n=20, d=8)
    sel = mipruner.prune("visionzip", budget=10, **kw)
    n_dom = 8  # round(54/64 * 10) = round(8.44)
    expect = set(torch.argsort(kw["attention"][0, 1:], descending=True)[:n_dom].tolist())
    assert set(sel.extras["dominant"].tolist()) == expect
    assert expect <= set(sel.keep.tolist()) and sel.keep.numel() == 10
    assert sel.tokens.shape == (10, 8)
    for i in expect:  # dominant rows are passed through unchanged
        row = sel.keep.tolist().index(i)
        assert torch.equal(sel.tokens[row], kw["visual"][i])


def test_visionzip_split_and_keep_all():
    assert dominant_count(64, 54 / 64) == 54
    assert dominant_count(2, 54 / 64) == 1  # at least one contextual token when K >= 2
    assert dominant_count(1, 54 / 64) == 1
    assert dominant_count(5, 0.0) == 0
    kw = rand_inputs(n=12, cls=False)
    sel = mipruner.prune("visionzip", budget=12, **kw)
    assert sel.keep.tolist() == list(range(12))
    assert torch.equal(sel.tokens, kw["visual"])  # nothing left to merge


def test_visionzip_without_cls_uses_column_sum():
    kw = rand_inputs(n=10, cls=False, seed=3)
    a = kw["attention"]
    col = a.sum(0) - torch.diagonal(a)
    sel = mipruner.prune("visionzip", budget=5, **kw)  # D = round(4.22) = 4
    assert set(sel.extras["dominant"].tolist()) == set(torch.argsort(col, descending=True)[:4].tolist())


def test_visionzip_zero_keys_and_bf16():
    kw = rand_inputs(n=16)
    kw["keys"] = torch.zeros_like(kw["keys"])
    kw["visual"] = kw["visual"].to(torch.bfloat16)
    sel = mipruner.prune("visionzip", budget=6, **kw)
    assert sel.tokens.dtype == torch.bfloat16 and bool(torch.isfinite(sel.tokens.float()).all())


def test_visionzip_cls_counts_in_the_budget():
    kw = rand_inputs(n=20, d=8)
    cls = torch.randn(1, 8)
    sel = mipruner.prune("visionzip", budget=10, cls=cls, **kw)
    # D = round(54/64 * 10) = 8 dominant INCLUDING [CLS]: 7 patches by [CLS] attention, 2 contextual
    assert sel.budget == 10 and sel.keep.numel() == 9 and torch.equal(sel.prefix, cls)
    top7 = torch.argsort(kw["attention"][0, 1:], descending=True)[:7].tolist()
    assert set(sel.extras["dominant"].tolist()) == set(top7) and sel.tokens.shape == (9, 8)
    # at 64 of 576 this is the release's [CLS] + 53 + 10
    big = rand_inputs(n=576, d=8, seed=1)
    sel = mipruner.prune("visionzip", budget=64, cls=torch.randn(1, 8), **big)
    assert sel.extras["dominant"].numel() == 53 and sel.keep.numel() == 63 and sel.budget == 64
    # views: one [CLS] per view, all kept; no room (K <= P) or keep-all: no [CLS], K patches
    sel = mipruner.prune("visionzip", budget=10, cls=torch.randn(3, 8), **kw)
    assert sel.prefix.shape == (3, 8) and sel.keep.numel() == 7 and sel.extras["dominant"].numel() == 5
    for k in (1, 3, 20):
        sel = mipruner.prune("visionzip", budget=k, cls=torch.randn(3, 8), **kw)
        assert sel.prefix is None and sel.keep.numel() == k
    assert mipruner.prune("visionzip", budget=20, cls=cls, **kw).keep.tolist() == list(range(20))


def test_visionzip_cls_errors():
    kw = rand_inputs(n=10, cls=False)
    with pytest.raises(ValueError, match="cls"):
        mipruner.prune("visionzip", budget=4, cls=torch.randn(1, 8), **kw)  # no [CLS] row in the attention
    kw = rand_inputs(n=10)
    with pytest.raises(ValueError, match="cls"):
        mipruner.prune("visionzip", budget=4, cls=torch.randn(1, 5), **kw)


# ----------------------------------------------------------------------------------------- vispruner

def test_vispruner_important_set_and_total():
    kw = rand_inputs(n=30, d=8)
    for k in (1, 2, 5, 8, 17, 29, 30):
        sel = mipruner.prune("vispruner", budget=k, **kw)
        n_imp = int(k * 0.5)  # the release's int(T * r): floored (2 of 5, 8 of 17)
        expect = torch.argsort(kw["attention"][0, 1:], descending=True)[:n_imp].tolist()
        assert set(sel.extras["important"].tolist()) == set(expect)
        assert set(expect) <= set(sel.keep.tolist())
        assert sel.keep.numel() == k == len(set(sel.keep.tolist()))


def descending_attention(n):
    """[CLS] attention falling with the index: the leftovers' order is the index order."""
    a = torch.full((n + 1, n + 1), 1.0 / (n + 1))
    a[0, 1:] = torch.linspace(0.9, 0.1, n)
    return a


def test_vispruner_drops_duplicate_first():
    feats = torch.eye(8)
    feats[5] = feats[2]  # 2 duplicates 5
    visual = torch.randn(8, 4)  # unrelated: the diverse stage must read `features`
    # leftovers by descending attention = 0..7: A = 0, 2, 4, 6 and B = 1, 3, 5, 7; 2 (in A) matches 5: dropped
    a = descending_attention(8)
    sel = mipruner.prune("vispruner", visual=visual, budget=7, attention=a, features=feats, ratio=0.0)
    assert sel.keep.tolist() == [0, 1, 3, 4, 5, 6, 7]
    # without `features` the projected tokens are used
    assert mipruner.prune("vispruner", visual=feats, budget=7, attention=a, ratio=0.0).keep.tolist() == \
        [0, 1, 3, 4, 5, 6, 7]
    # the split follows the attention order: leftovers 1, 0, 3, 2, 5, 4, 7, 6 put 5 in A and 2 in B
    a[0, 1:] = torch.tensor([0.8, 0.9, 0.6, 0.7, 0.4, 0.5, 0.2, 0.3])
    sel = mipruner.prune("vispruner", visual=visual, budget=7, attention=a, features=feats, ratio=0.0)
    assert sel.keep.tolist() == [0, 1, 2, 3, 4, 6, 7]


def test_vispruner_duplicates_go_before_distinct_last_round_partial():
    feats = torch.eye(12)
    feats[7] = feats[4]  # even 4 duplicates odd 7
    feats[10] = feats[1] * 3.0  # even 10 duplicates odd 1: a scaled copy is a duplicate by cosine
    # 12 -> 10: one round that drops only the 2 needed (not drop_per_round = 8): the two even copies
    sel = mipruner.prune("vispruner", visual=feats, budget=10, attention=descending_attention(12), ratio=0.0)
    assert sel.keep.tolist() == [0, 1, 2, 3, 5, 6, 7, 8, 9, 11]
    assert sel.extras["drop_round"].tolist() == [-1] * 4 + [0] + [-1] * 5 + [0, -1]


def cosine_features(pairs: dict, n: int) -> torch.Tensor:
    """Unit rows whose cosines are the identity plus the given symmetric entries (diagonally dominant)."""
    c = torch.eye(n, dtype=torch.float64)
    for (i, j), v in pairs.items():
        c[i, j] = c[j, i] = v
    return torch.linalg.cholesky(c).to(torch.float32)  # rows: unit norm, pairwise dot products = c


def test_vispruner_reorders_survivors_between_rounds():
    # leftovers 0..7 (descending attention), K = 5, 2 per round.
    # round 0: A = 0 2 4 6, B = 1 3 5 7; red = .4 (0~1), .3 (2~3), .1 (4~5), .2 (6~7): drop 0, 2.
    #          new order: the survivors of A by DESCENDING redundancy, 6 (.2) then 4 (.1), then B: 6 4 1 3 5 7
    # round 1: A = 6 1 5, B = 4 3 7; red = .2 (6~7), 0, .5 (5~7): drop 5 (r = 6 - 5 = 1)
    # (index order instead would split A = 1 4 6, B = 3 5 7 and drop 6, keeping 1 3 4 5 7)
    feats = cosine_features({(0, 1): 0.4, (2, 3): 0.3, (4, 5): 0.1, (6, 7): 0.2, (5, 7): 0.5}, 8)
    sel = mipruner.prune("vispruner", visual=feats, budget=5, attention=descending_attention(8), ratio=0.0,
                         drop_per_round=2)
    assert sel.keep.tolist() == [1, 3, 4, 6, 7]
    assert sel.order.tolist() == [6, 1, 4, 3, 7]  # the final leftover order: A survivors, then B
    assert sel.extras["drop_round"].tolist() == [0, -1, 0, -1, -1, 1, -1, -1]


def naive_diverse(feats, n_keep, per_round):
    """The diverse stage from its description, in float64 Python, on rows in their given order.
    Also returns the smallest gap between two redundancies it ranked (ties would make it moot)."""
    u = torch.nn.functional.normalize(feats.double(), dim=1).tolist()
    order, gap = list(range(feats.shape[0])), float("inf")
    while len(order) > n_keep:
        a, b = order[0::2], order[1::2]
        red = [max(sum(x * y for x, y in zip(u[i], u[j])) for j in b) for i in a]  # best cosine in B
        r = min(per_round, len(order) - n_keep, len(a))
        ranked = sorted(range(len(a)), key=lambda i: -red[i])  # most redundant first
        # swaps among the dropped change nothing; any other swap changes the survivors or their order
        gap = min([gap] + [red[ranked[i]] - red[ranked[i + 1]] for i in range(max(r - 1, 0), len(a) - 1)])
        order = [a[i] for i in ranked[r:]] + b
    return order, gap


@pytest.mark.parametrize("path", ["dense", "sparse-32", "sparse-2"])  # sparse-2: most rows recomputed
def test_vispruner_diverse_matches_naive(monkeypatch, path):
    from mipruner.pruners import vispruner as vp

    if path.startswith("sparse"):
        monkeypatch.setattr(vp, "NEIGHBOURS", int(path.split("-")[1]))
    g = torch.Generator().manual_seed(4)  # a seed whose rankings have no near-ties (checked below)
    centres = torch.randn(6, 10, generator=g)
    feats = centres[torch.randint(0, 6, (70,), generator=g)] + 0.3 * torch.randn(70, 10, generator=g)
    for n_keep, per_round in [(1, 8), (9, 8), (30, 3), (69, 8), (40, 5)]:
        want, gap = naive_diverse(feats, n_keep, per_round)
        assert gap > 1e-5, "the inputs must have no near-ties for this comparison to be meaningful"
        survivors, _ = vp.drop_duplicates(feats, n_keep, per_round, dense=path == "dense")
        assert survivors.tolist() == want


def test_vispruner_bad_args():
    kw = rand_inputs(n=10)
    with pytest.raises(ValueError, match="features"):
        mipruner.prune("vispruner", budget=4, features=torch.randn(11, 3), **kw)
    with pytest.raises(ValueError, match="drop_per_round"):
        mipruner.prune("vispruner", budget=4, drop_per_round=0, **kw)
    with pytest.raises(ValueError, match="ratio"):
        mipruner.prune("vispruner", budget=4, ratio=1.5, **kw)


# -------------------------------------------------------------------------------------- mi_attention

@pytest.mark.parametrize("k", [1, 6, 13])
def test_mi_attention_split_one_is_attention(k):
    kw = rand_inputs(n=24)
    a = mipruner.prune("mi_attention", budget=k, split=1.0, **kw)
    b = mipruner.prune("attention", visual=kw["visual"], budget=k, attention=kw["attention"])
    assert a.keep.tolist() == b.keep.tolist() and a.order.tolist() == b.order.tolist()


@pytest.mark.parametrize("lam", [0.5, 1.0, 0.2])
def test_mi_attention_split_zero_is_mi(lam):
    kw = rand_inputs(n=24)
    a = mipruner.prune("mi_attention", budget=9, split=0.0, lam=lam, tau=0.2, **kw)
    b = mipruner.prune("mi", visual=kw["visual"], text=kw["text"], budget=9, lam=lam, tau=0.2)
    assert a.order.tolist() == b.order.tolist()
    assert torch.allclose(a.pmi, b.pmi) and torch.equal(a.pivot, b.pivot)


@pytest.mark.parametrize("split", [0.25, 0.5, 0.8])
@pytest.mark.parametrize("lam", [0.5, 1.0])
def test_mi_attention_round_one_kept(split, lam):
    kw = rand_inputs(n=24, seed=1)
    k = 10
    sel = mipruner.prune("mi_attention", budget=k, split=split, lam=lam, **kw)
    k1 = int(split * k + 0.5)
    top = torch.argsort(kw["attention"][0, 1:], descending=True)[:k1].tolist()
    assert set(top) <= set(sel.keep.tolist()) and sel.keep.numel() == k
    assert set(sel.order[:k1].tolist()) == set(top)
    assert bool(torch.isfinite(sel.scores).all())
    if lam == 1.0:  # round 2: the best relevance among the rest
        rel = mipruner.prune("mi", visual=kw["visual"], text=kw["text"], budget=1, lam=1.0).scores
        rel[top] = -float("inf")
        assert set(sel.order[k1:].tolist()) == set(torch.argsort(rel, descending=True)[:k - k1].tolist())


def test_mi_attention_round_one_seeds_redundancy():
    visual = torch.eye(8)
    visual[1] = visual[0]  # token 1 duplicates token 0
    # two prompt tokens (with one, p(t|v) = 1 and every PMI is 0): one points at tokens 0/1, one is vague
    text = torch.stack([visual[0], torch.nn.functional.normalize(visual[2:].sum(0), dim=0)])
    a = torch.zeros(9, 9)
    a[0, 1:] = torch.tensor([0.9, 0.0, 0.02, 0.02, 0.02, 0.02, 0.01, 0.01])  # round 1 takes token 0
    relevance_only = mipruner.prune("mi_attention", visual=visual, text=text, budget=2, attention=a, lam=1.0)
    assert relevance_only.keep.tolist() == [0, 1]
    seeded = mipruner.prune("mi_attention", visual=visual, text=text, budget=2, attention=a, lam=0.1)
    assert seeded.order.tolist()[0] == 0 and len(set(seeded.keep.tolist())) == 2
    assert 1 not in seeded.keep.tolist()


def test_mi_attention_shares_cache_with_mi():
    kw = rand_inputs(n=16)
    cache = {}
    mipruner.prune("mi", visual=kw["visual"], text=kw["text"], budget=4, cache=cache)
    n = len(cache)
    mipruner.prune("mi_attention", budget=4, cache=cache, **kw)
    assert len(cache) == n  # same (tau, normalization): nothing recomputed


# -------------------------------------------------------------------------------------------- shared

@pytest.mark.parametrize("name", ENCODER_METHODS)
@pytest.mark.parametrize("cls", [True, False])
def test_keep_all_and_contract(name, cls):
    kw = rand_inputs(n=14, cls=cls)
    sel = mipruner.prune(name, budget=14, **kw)
    assert sel.keep.tolist() == list(range(14)) and sel.keep.dtype == torch.int64
    for k in (1, 3, 7):
        sel = mipruner.prune(name, budget=k, **kw)
        assert sel.keep.dtype == torch.int64 and sel.keep.tolist() == sorted(set(sel.keep.tolist()))
        assert len(sel.keep) == k and sel.scores.shape == (14,) and bool(torch.isfinite(sel.scores).all())


@pytest.mark.parametrize("name", ENCODER_METHODS)
def test_missing_attention(name):
    kw = rand_inputs(n=10)
    del kw["attention"]
    with pytest.raises(ValueError, match="needs attention"):
        mipruner.prune(name, budget=3, **kw)


@pytest.mark.parametrize("name", ENCODER_METHODS)
@pytest.mark.parametrize("shape", [(12, 12), (9, 9), (11, 10), (11,)])
def test_wrong_attention_shape(name, shape):
    kw = rand_inputs(n=10)
    kw["attention"] = torch.rand(*shape)
    with pytest.raises(ValueError, match="attention"):
        mipruner.prune(name, budget=3, **kw)


def test_wrong_attention_shape_message():
    kw = rand_inputs(n=10)
    kw["attention"] = torch.rand(12, 12)
    with pytest.raises(ValueError, match=r"\(11, 11\).*\(10, 10\)"):
        mipruner.prune("attention", budget=3, **kw)


def test_visionzip_keys_errors():
    kw = rand_inputs(n=10)
    with pytest.raises(ValueError, match="needs keys"):
        mipruner.prune("visionzip", budget=3, **{**kw, "keys": None})
    with pytest.raises(ValueError, match="keys must have 11 rows"):
        mipruner.prune("visionzip", budget=3, **{**kw, "keys": torch.randn(10, 6)})
