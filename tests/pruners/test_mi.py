"""MI-Pruner against hand-computed values, an independent reference, and its properties."""
import math

import pytest
import torch

import mipruner
from mipruner.pruners import mi as mi_mod
from mipruner.pruners.mi import SelfPMI, cross_pmi, greedy_select

from ..paths import assert_paths_close


def reference_mi(V, T, K, lam, tau, aggregation="max", mean_weights="all"):
    """Alg. 1 written out with Python floats and loops, independent of the library code.
    mean_weights="kept": the "mean" redundancy's weights p(v_j|v_i) renormalised over the chosen set."""
    def unit(x):
        n = math.sqrt(sum(a * a for a in x)) or 1.0
        return [a / n for a in x]

    v = [unit(r) for r in V.tolist()]
    t = [unit(r) for r in T.tolist()]
    nv, nt = len(v), len(t)
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731

    def softmax(xs):
        m = max(xs)
        e = [math.exp(x - m) for x in xs]
        s = sum(e)
        return [x / s for x in e]

    p_t_v = [softmax([dot(v[i], t[j]) / tau for j in range(nt)]) for i in range(nv)]
    p_t = [sum(p_t_v[i][j] for i in range(nv)) / nv for j in range(nt)]
    pmi = [[math.log(p_t_v[i][j] / p_t[j]) for j in range(nt)] for i in range(nv)]
    p_v_v = [softmax([dot(v[i], v[j]) / tau for j in range(nv)]) for i in range(nv)]
    pmi_s = [[math.log(p_v_v[i][j] * nv) for j in range(nv)] for i in range(nv)]
    if aggregation == "max":
        s_cross = [max(r) for r in pmi]
    else:
        s_cross = [sum(p_t_v[i][j] * pmi[i][j] for j in range(nt)) for i in range(nv)]
    chosen = []
    for _ in range(K):
        best, best_i = -math.inf, None
        for i in range(nv):
            if i in chosen:
                continue
            if not chosen:
                red = 0.0
            elif aggregation == "max":
                red = max(pmi_s[i][j] for j in chosen)
            else:
                w = [p_v_v[i][j] for j in chosen]
                if mean_weights == "kept":
                    w = [x / sum(w) for x in w]
                red = sum(wj * pmi_s[i][j] for wj, j in zip(w, chosen))
            s = lam * s_cross[i] - (1 - lam) * red
            if s > best:
                best, best_i = s, i
        chosen.append(best_i)
    return chosen, pmi, s_cross


def test_hand_computed_pmi():
    # v1 = e1, v2 = e2, v3 = (e1 + e2)/sqrt2; t1 = e1, t2 = e2; tau = 1.
    V = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    T = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    c = cross_pmi(V, T, tau=1.0)
    e = math.e
    # p(t1|v1) = e/(e+1), p(t2|v1) = 1/(e+1), v3 is uniform; p(t_j) = 1/2 for both.
    expected = torch.tensor([[math.log(2 * e / (e + 1)), math.log(2 / (e + 1))],
                             [math.log(2 / (e + 1)), math.log(2 * e / (e + 1))],
                             [0.0, 0.0]])
    assert torch.allclose(c.pmi, expected, atol=1e-6)
    assert c.pivot[:2].tolist() == [0, 1]
    # Total probability: sum_i p(t_j|v_i) / N_V == p(t_j), so mean_i exp(PMI) * p(t_j) ... = 1/2.
    assert torch.allclose(c.log_p.exp().mean(0), torch.tensor([0.5, 0.5]), atol=1e-6)


@pytest.mark.parametrize("lam", [1.0, 0.7, 0.5, 0.2])
@pytest.mark.parametrize("aggregation", ["max", "mean"])
def test_matches_reference(lam, aggregation):
    g = torch.Generator().manual_seed(3)
    V, T = torch.randn(24, 8, generator=g), torch.randn(5, 8, generator=g)
    chosen, pmi, s_cross = reference_mi(V, T, 7, lam, 0.1, aggregation)
    sel = mipruner.prune("mi", visual=V, text=T, budget=7, lam=lam, tau=0.1, aggregation=aggregation)
    assert sel.order.tolist() == chosen
    assert sel.keep.tolist() == sorted(chosen)
    assert torch.allclose(sel.pmi, torch.tensor(pmi), atol=1e-4)
    assert torch.allclose(sel.extras["relevance"], torch.tensor(s_cross), atol=1e-4)


def test_lambda_one_is_a_sort_of_relevance():
    g = torch.Generator().manual_seed(0)
    V, T = torch.randn(200, 32, generator=g), torch.randn(9, 32, generator=g)
    sel = mipruner.prune("mi", visual=V, text=T, budget=20, lam=1.0)
    s = cross_pmi(V, T, 0.1).pmi.max(dim=1).values
    assert sel.order.tolist() == torch.argsort(s, descending=True)[:20].tolist()
    assert_paths_close(sel.scores, s, name="scores")  # the method's path against the restatement


def test_heap_and_greedy_agree_at_lambda_one():
    g = torch.Generator().manual_seed(1)
    V, T = torch.randn(150, 16, generator=g), torch.randn(6, 16, generator=g)
    top = mipruner.prune("mi", visual=V, text=T, budget=30, lam=1.0)
    rel = cross_pmi(V, T, 0.1).relevance("max")
    order, _, _ = greedy_select(rel, SelfPMI(V, 0.1), 30, lam=1.0)
    assert order.tolist() == top.order.tolist()


@pytest.mark.parametrize("lam", [1.0, 0.5])
def test_permutation_equivariance(lam):
    g = torch.Generator().manual_seed(2)
    V, T = torch.randn(64, 16, generator=g), torch.randn(6, 16, generator=g)
    perm = torch.randperm(64, generator=g)
    a = mipruner.prune("mi", visual=V, text=T, budget=12, lam=lam)
    b = mipruner.prune("mi", visual=V[perm], text=T, budget=12, lam=lam)
    assert sorted(perm[b.keep].tolist()) == a.keep.tolist()
    assert perm[b.order].tolist() == a.order.tolist()
    # Permuting the text tokens changes nothing but the pivot labels.
    tp = torch.randperm(6, generator=g)
    c = mipruner.prune("mi", visual=V, text=T[tp], budget=12, lam=lam)
    assert c.order.tolist() == a.order.tolist()
    assert torch.equal(tp[c.pivot], a.pivot)


def test_mean_aggregation_formula():
    g = torch.Generator().manual_seed(4)
    V, T = torch.randn(40, 12, generator=g), torch.randn(7, 12, generator=g)
    tau = 0.2
    v = V / V.norm(dim=1, keepdim=True)
    t = T / T.norm(dim=1, keepdim=True)
    p = torch.softmax(v @ t.T / tau, dim=1)
    pmi = torch.log(p / p.mean(0, keepdim=True))
    expected = (p * pmi).sum(1)
    sel = mipruner.prune("mi", visual=V, text=T, budget=5, lam=1.0, tau=tau, aggregation="mean")
    assert torch.allclose(sel.scores, expected, atol=1e-5)
    # The mean is a p-weighted average of PMI, so it never exceeds the max.
    assert bool((expected <= pmi.max(1).values + 1e-6).all())


def test_redundancy_term_skips_duplicates():
    g = torch.Generator().manual_seed(5)
    T = torch.randn(3, 16, generator=g)
    V = torch.randn(30, 16, generator=g)
    V[7] = T[0] * 3 + 0.01 * torch.randn(16, generator=g)  # the most relevant token ...
    V[8] = V[7].clone()  # ... and its exact copy
    both = mipruner.prune("mi", visual=V, text=T, budget=2, lam=1.0)
    assert both.keep.tolist() == [7, 8]  # relevance alone keeps the copy
    div = mipruner.prune("mi", visual=V, text=T, budget=2, lam=0.5)
    # 7 and 8 tie exactly: which one comes first is the tie rule's business; exactly one is kept
    assert div.order[0].item() in (7, 8) and len({7, 8} & set(div.keep.tolist())) == 1


def test_chunked_equals_dense(monkeypatch):
    g = torch.Generator().manual_seed(6)
    V, T = torch.randn(90, 16, generator=g), torch.randn(4, 16, generator=g)
    for norm in ("softmax", "minmax"):
        dense = mipruner.prune("mi", visual=V, text=T, budget=15, lam=0.4, normalization=norm)
        monkeypatch.setattr(mi_mod, "DENSE_LIMIT", 10)
        monkeypatch.setattr(mi_mod, "_CHUNK", 32)
        chunked = mipruner.prune("mi", visual=V, text=T, budget=15, lam=0.4, normalization=norm)
        assert SelfPMI(V, 0.1, norm).cos is None  # the dense matrix was really not held
        monkeypatch.undo()
        assert SelfPMI(V, 0.1, norm).cos is not None
        assert chunked.order.tolist() == dense.order.tolist()
        assert torch.allclose(chunked.scores, dense.scores, atol=1e-4)


def test_minmax_formula_and_finiteness():
    g = torch.Generator().manual_seed(7)
    V, T = torch.randn(20, 6, generator=g), torch.randn(4, 6, generator=g)
    v = V / V.norm(dim=1, keepdim=True)
    t = T / T.norm(dim=1, keepdim=True)
    rho = v @ t.T / 0.1
    hat = (rho - rho.min(1, keepdim=True).values) / (rho.max(1, keepdim=True).values - rho.min(1, keepdim=True).values)
    p = hat / hat.sum(1, keepdim=True)
    c = cross_pmi(V, T, 0.1, "minmax")
    nz = p > 0
    assert torch.allclose(c.log_p.exp(), p, atol=1e-6)
    assert torch.allclose(c.pmi[nz], torch.log(p / p.mean(0, keepdim=True))[nz], atol=1e-4)
    sel = mipruner.prune("mi", visual=V, text=T, budget=6, lam=0.5, normalization="minmax", aggregation="mean")
    assert bool(torch.isfinite(sel.scores).all()) and bool(torch.isfinite(sel.pmi).all())


def test_cache_reuse_and_misuse():
    g = torch.Generator().manual_seed(8)
    V, T = torch.randn(50, 8, generator=g), torch.randn(3, 8, generator=g)
    cache = {}
    a = mipruner.prune("mi", visual=V, text=T, budget=10, lam=0.5, cache=cache)
    self_pmi = cache[("self", 0.1, "softmax")]
    b = mipruner.prune("mi", visual=V, text=T, budget=20, lam=0.3, cache=cache)
    assert cache[("self", 0.1, "softmax")] is self_pmi  # the normaliser was reused, not rebuilt
    fresh = mipruner.prune("mi", visual=V, text=T, budget=20, lam=0.3)
    assert torch.equal(b.keep, fresh.keep) and a.budget == 10
    with pytest.raises(ValueError, match="cache"):
        mipruner.prune("mi", visual=V.clone(), text=T, budget=10, cache=cache)


def test_low_precision_and_zero_rows():
    g = torch.Generator().manual_seed(9)
    V, T = torch.randn(40, 8, generator=g), torch.randn(3, 8, generator=g)
    V[3] = 0.0
    ref = mipruner.prune("mi", visual=V, text=T, budget=8, lam=0.5)
    assert bool(torch.isfinite(ref.scores).all()) and bool(torch.isfinite(ref.pmi).all())
    for dt in (torch.float16, torch.bfloat16):
        low = mipruner.prune("mi", visual=V.to(dt), text=T.to(dt), budget=8, lam=0.5)
        assert low.scores.dtype == torch.float32 and bool(torch.isfinite(low.scores).all())
        assert len(set(low.keep.tolist()) & set(ref.keep.tolist())) >= 6


@pytest.mark.parametrize("kw,match", [
    (dict(tau=0.0), "tau"), (dict(tau=-1.0), "tau"), (dict(lam=1.5), "lam"), (dict(lam=-0.1), "lam"),
    (dict(aggregation="sum"), "aggregation"), (dict(normalization="l2"), "normalization"),
])
def test_bad_parameters(kw, match):
    V, T = torch.randn(10, 4), torch.randn(2, 4)
    with pytest.raises(ValueError, match=match):
        mipruner.prune("mi", visual=V, text=T, budget=3, **kw)


def test_greedy_init_seeds_redundancy_and_scores():
    g = torch.Generator().manual_seed(10)
    V, T = torch.randn(30, 8, generator=g), torch.randn(3, 8, generator=g)
    rel = cross_pmi(V, T, 0.1).relevance("max")
    sp = SelfPMI(V, 0.1)
    init = torch.tensor([4, 11])
    order, scores, red = greedy_select(rel, sp, 5, lam=0.5, init=init)
    assert not set(order.tolist()) & {4, 11}
    assert torch.equal(scores[init], 0.5 * rel[init]) and bool(torch.isfinite(scores).all())
    # The first pick already pays for redundancy with the init tokens.
    expected_first = int((0.5 * rel - 0.5 * torch.maximum(sp.pmi_col(4), sp.pmi_col(11)))
                         .masked_fill(torch.isin(torch.arange(30), init), -math.inf).argmax())
    assert order[0].item() == expected_first


# ----------------------------------------------- mean_weights: the "mean" redundancy's normalisation
def test_mean_weights_hand_case():
    """A, B nearly the same direction, C orthogonal to both; relevance given: A 1.0, B 0.9, C 0.5.

    tau = 0.1, N_V = 3, rho_self = cos / tau:  A: (10, 9.9, 0)  B: (9.9, 10, 0)  C: (0, 0, 10).
    Pick 1 is A (no redundancy yet). Pick 2, lam = 0.5, with S_self_i over the kept set {A}:
      all:  S_self_i = p(A|i) PMI(i, A)     B: 0.4750 * log(3 * 0.4750) = 0.168;  C: ~ -4e-4
            gains  B: 0.45 - 0.084 = 0.366  >  C: 0.25 + 0.0002  -> B
      kept: S_self_i = PMI(i, A) (one token: weight 1)   B: 0.354;  C: log(3 / (e^10 + 2)) = -8.90
            gains  B: 0.45 - 0.177 = 0.273  <  C: 0.25 + 4.45 = 4.70  -> C
    """
    c = 0.99
    V = torch.tensor([[1.0, 0.0, 0.0], [c, math.sqrt(1 - c * c), 0.0], [0.0, 0.0, 1.0]])
    rel = torch.tensor([1.0, 0.9, 0.5])
    sp = SelfPMI(V, 0.1)
    p_ab = math.exp(9.9) / (math.exp(10) + math.exp(9.9) + 1)  # p(A|B)
    p_ac = 1 / (math.exp(10) + 2)  # p(A|C)
    gains = {"all": (0.45 - 0.5 * p_ab * math.log(3 * p_ab), 0.25 - 0.5 * p_ac * math.log(3 * p_ac)),
             "kept": (0.45 - 0.5 * math.log(3 * p_ab), 0.25 - 0.5 * math.log(3 * p_ac))}  # (B, C) at pick 2
    for mw, second in (("all", 1), ("kept", 2)):
        b, c_ = gains[mw]
        assert (b > c_) == (second == 1)  # the hand computation itself decides the pick
        order, scores, _ = greedy_select(rel, sp, 2, lam=0.5, aggregation="mean", mean_weights=mw)
        assert order.tolist() == [0, second], mw
        assert scores[0].item() == pytest.approx(0.5)  # pick 1: lam * relevance
        assert scores[second].item() == pytest.approx(max(b, c_), rel=1e-4), mw  # its gain when picked
    # the same through mipruner.prune, against the pure-Python restatement
    g = torch.Generator().manual_seed(12)
    V, T = torch.randn(30, 8, generator=g), torch.randn(4, 8, generator=g)
    picks = {mw: mipruner.prune("mi", visual=V, text=T, budget=8, lam=0.5, aggregation="mean", mean_weights=mw)
             for mw in ("all", "kept")}
    assert picks["all"].keep.tolist() != picks["kept"].keep.tolist()  # the choice changes the selection


@pytest.mark.parametrize("lam", [0.7, 0.5, 0.2])
@pytest.mark.parametrize("normalization", ["softmax", "minmax"])
def test_mean_weights_kept_matches_reference(lam, normalization):
    g = torch.Generator().manual_seed(13)
    V, T = torch.randn(24, 8, generator=g), torch.randn(5, 8, generator=g)
    sel = mipruner.prune("mi", visual=V, text=T, budget=7, lam=lam, tau=0.1, aggregation="mean",
                         mean_weights="kept", normalization=normalization)
    if normalization == "softmax":
        chosen, _, _ = reference_mi(V, T, 7, lam, 0.1, "mean", mean_weights="kept")
        assert sel.order.tolist() == chosen
    # with one token kept, the weighted mean over the kept set is that token's PMI: "max"'s pick 2
    a = mipruner.prune("mi", visual=V, text=T, budget=2, lam=lam, aggregation="mean", mean_weights="kept",
                       normalization=normalization)
    rel = cross_pmi(V, T, 0.1, normalization).relevance("mean")
    b, _, _ = greedy_select(rel, SelfPMI(V, 0.1, normalization), 2, lam, aggregation="max")
    assert a.order.tolist() == b.tolist()


def test_mean_weights_kept_survives_underflowing_weights():
    """tau = 0.005: p(v_j|v_i) for a dissimilar j is ~exp(-400), 0 in float32; the kept-set weights
    are computed in log space, so the redundancy stays finite and equals a float64 computation."""
    g = torch.Generator().manual_seed(14)
    V = torch.randn(12, 6, generator=g)
    sp = SelfPMI(V, 0.005)
    order, scores, red = greedy_select(torch.zeros(12), sp, 4, lam=0.5, aggregation="mean", mean_weights="kept")
    assert bool(torch.isfinite(red).all()) and bool(torch.isfinite(scores).all())
    u = (V / V.norm(dim=1, keepdim=True)).double()
    rho = u @ u.T / 0.005
    log_p = rho - torch.logsumexp(rho, dim=1, keepdim=True)  # [i, j] log p(v_j|v_i)
    kept = order
    w = torch.softmax(log_p[:, kept], dim=1)  # renormalised over the kept set, float64
    expected = (w * (log_p[:, kept] + math.log(12))).sum(dim=1)
    assert torch.allclose(red.double(), expected, rtol=1e-4, atol=1e-3)


def test_mean_weights_seeded_by_init_and_registered():
    g = torch.Generator().manual_seed(15)
    V, T = torch.randn(20, 8, generator=g), torch.randn(3, 8, generator=g)
    rel = cross_pmi(V, T, 0.1).relevance("mean")
    sp = SelfPMI(V, 0.1)
    init = torch.tensor([3, 9])
    order, _, _ = greedy_select(rel, sp, 1, lam=0.5, aggregation="mean", init=init, mean_weights="kept")
    u = V / V.norm(dim=1, keepdim=True)
    log_p = torch.log_softmax(u @ u.T / 0.1, dim=1)
    w = torch.softmax(log_p[:, init], dim=1)
    red = (w * (log_p[:, init] + math.log(20))).sum(dim=1)
    gain = (0.5 * rel - 0.5 * red).masked_fill(torch.isin(torch.arange(20), init), -math.inf)
    assert order.tolist() == [int(gain.argmax())]
    for name in ("mi", "mi_attention"):
        p = mipruner.get_pruner(name).param("mean_weights")
        assert p.default == "all" and p.choices == ("all", "kept")
        extra = {"attention": torch.softmax(torch.randn(21, 21, generator=g), dim=-1)} if name == "mi_attention" else {}
        with pytest.raises(ValueError, match="mean_weights"):
            mipruner.prune(name, visual=V, text=T, budget=3, mean_weights="selected", **extra)


@pytest.mark.parametrize("aggregation", ["max", "mean"])
def test_minmax_entries_a_few_ulps_above_the_row_minimum_are_the_minimum(aggregation):
    """The chunked self-PMI takes a row's minimum from one matrix product and its entries from another,
    and on some CPUs the entry that is the minimum comes out an ulp or a few above it. Made here on any
    CPU: the normalisers from the Gram matrix, then the matrix with each row's minimum raised by 1 to 4
    ulps (the table reads cos[j, i] for row i's entry j). The redundancy table is the same bit for bit (the entries snap to the minimum:
    p = 0, floored at tiny), not log p -17 instead of -87 for each row's least similar token."""
    g = torch.Generator().manual_seed(21)
    V = torch.randn(40, 8, generator=g)
    sp = SelfPMI(V, 0.1, "minmax")
    want = sp.table(aggregation).clone()
    cos = sp.cos.clone()
    low = cos.argmin(dim=1)
    rows = torch.arange(cos.shape[0])
    bumped = cos.clone()
    for i, j in zip(rows.tolist(), low.tolist()):
        v = cos[i, j]
        for _ in range(1 + i % 4):
            v = torch.nextafter(v, torch.tensor(math.inf))
        bumped[j, i] = v
    assert bool((bumped[low, rows] > cos[low, rows]).all())  # really above the minimum the stats hold
    sp.cos = bumped
    sp._dense.clear()
    got = sp.table(aggregation)
    assert torch.equal(got, want)
    if aggregation == "max":  # each row's minimum is at the floor: log(tiny) + log N_V
        floor = math.log(torch.finfo(torch.float32).tiny) + math.log(40)
        assert torch.allclose(want[low, rows], torch.full((40,), floor), atol=1e-4)
