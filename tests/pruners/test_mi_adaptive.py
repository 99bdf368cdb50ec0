"""MI-Pruner with a per-input K (`mi_adaptive`): the stopping rules on inputs with a known answer."""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.pruners.mi import cross_pmi
from mipruner.pruners.mi_adaptive import stop_index

from ..paths import assert_paths_close


def scene(n_object: int, n: int = 32, d: int = 8):
    """`n_object` tokens along text token 0 (slightly different from each other), the rest (the
    background) along another axis and turned slightly away from text token 0."""
    g = torch.Generator().manual_seed(n_object)
    V = torch.zeros(n, d)
    V[:n_object, 0] = 1.0
    V[n_object:, 2], V[n_object:, 0] = 1.0, -0.3
    V += 0.001 * torch.randn(n, d, generator=g)
    T = torch.zeros(2, d)
    T[0, 0] = T[1, 1] = 1.0
    return V, T


def test_fixed_is_mi_itself():
    V, T = scene(3)
    for lam in (1.0, 0.5):
        a = mipruner.prune("mi_adaptive", visual=V, text=T, budget=7, lam=lam)
        b = mipruner.prune("mi", visual=V, text=T, budget=7, lam=lam)
        assert torch.equal(a.order, b.order)
        assert_paths_close(a.scores, b.scores, name="scores")  # another function's path: within tolerance


@pytest.mark.parametrize("n_object", [3, 6])
def test_gain_rule_keeps_the_object_and_stops(n_object):
    V, T = scene(n_object)
    rel = cross_pmi(V, T).relevance("max")
    # the premise: object tokens carry more than twice the PMI of the background's best
    assert rel[:n_object].min() > 2 * rel[n_object:].max()
    sel = mipruner.prune("mi_adaptive", visual=V, text=T, budget=12, lam=1.0, k_rule="gain", gain_ratio=0.5)
    assert sel.keep.tolist() == list(range(n_object))  # K chosen per input: 3 here, 6 there
    assert sel.extras["gains"].shape == (12,) and sel.extras["k_rule"] == "gain"
    # a lower ratio lets the background in, up to the budget
    assert mipruner.prune("mi_adaptive", visual=V, text=T, budget=12, lam=1.0, k_rule="gain",
                          gain_ratio=0.01).budget == 12


def test_mass_rule_counts_pmi_mass():
    V, T = scene(3)
    rel = cross_pmi(V, T).relevance("max").clamp_min(0)
    total, obj = float(rel.sum()), float(rel[:3].sum())
    share = obj / total  # the object's share of the mass
    sel = mipruner.prune("mi_adaptive", visual=V, text=T, budget=16, lam=1.0, k_rule="mass",
                         mass_share=share * 0.999)
    assert sel.keep.tolist() == [0, 1, 2]
    more = mipruner.prune("mi_adaptive", visual=V, text=T, budget=32, lam=1.0, k_rule="mass", mass_share=0.8)
    srt = rel.sort(descending=True).values
    need = int(torch.nonzero(torch.cumsum(srt, 0) >= 0.8 * total)[0]) + 1
    assert more.budget == need and 3 < need < 32
    capped = mipruner.prune("mi_adaptive", visual=V, text=T, budget=need - 1, lam=1.0, k_rule="mass", mass_share=0.8)
    assert capped.budget == need - 1  # the budget caps K


def test_greedy_stops_on_a_prefix_of_mi():
    torch.manual_seed(0)
    V, T = torch.randn(40, 16), torch.randn(5, 16)
    full = mipruner.prune("mi", visual=V, text=T, budget=20, lam=0.5)
    for rule, kw in (("gain", {"gain_ratio": 0.7}), ("mass", {"mass_share": 0.3})):
        sel = mipruner.prune("mi_adaptive", visual=V, text=T, budget=20, lam=0.5, k_rule=rule, **kw)
        k = sel.budget
        assert 1 <= k < 20 and torch.equal(sel.order, full.order[:k])
        gains = sel.extras["gains"]
        if rule == "gain":  # the first pick below 0.7 x the best gain before it is not kept
            peak = [float(gains[:t].max()) for t in range(1, 21)]
            assert float(gains[k]) < 0.7 * peak[k - 1]
            assert all(float(gains[t]) >= 0.7 * peak[t - 1] for t in range(1, k))


def test_stop_index_edges_and_validation():
    order = torch.arange(4)
    rel = torch.tensor([1.0, 1.0, 1.0, 1.0])
    assert stop_index(torch.tensor([0.0, -1.0, -2.0, -3.0]), rel, order, "gain", 0.5, 0.5) == 1  # at least one
    assert stop_index(torch.tensor([4.0, 3.0, 2.5, 2.1]), rel, order, "gain", 0.5, 0.5) == 4  # never below
    # against the best gain so far, not the first: a rise (lam < 1's diversity bonus) raises the bar
    assert stop_index(torch.tensor([1.0, 6.0, 4.0, 2.9]), rel, order, "gain", 0.5, 0.5) == 3
    assert stop_index(torch.ones(4), rel, order, "mass", 0.5, 0.5) == 2
    assert stop_index(torch.ones(4), rel, order, "fixed", 0.5, 0.5) == 4
    V, T = scene(3)
    with pytest.raises(ValueError, match="k_rule must be one of"):
        mipruner.prune("mi_adaptive", visual=V, text=T, budget=4, k_rule="auto")
    with pytest.raises(ValueError, match="gain_ratio"):
        mipruner.prune("mi_adaptive", visual=V, text=T, budget=4, gain_ratio=0.0)
    with pytest.raises(ValueError, match="mass_share"):
        mipruner.prune("mi_adaptive", visual=V, text=T, budget=4, mass_share=1.5)
