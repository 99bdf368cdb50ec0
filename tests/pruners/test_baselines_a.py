"""Hand-checked and brute-force tests for the Random, Similarity, DivPrune and CDPruner baselines.

Expected values come from the methods' formulas, worked by hand in the comments or recomputed here
by brute force in float64 (determinants, full distance matrices); never from the implementation.
"""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from mipruner.pruners import cdpruner as cdp
from mipruner.pruners import divprune as dvp
from mipruner.pruners import mi, prune

NAMES = ("random", "similarity", "divprune", "cdpruner")


def rand_inputs(n=24, d=8, n_t=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randn(n_t, d, generator=g)


def unit_angles(degrees, norms=None):
    """2-D points at the given angles; optional per-point norms (cosine must ignore them)."""
    rad = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    pts = torch.stack([rad.cos(), rad.sin()], dim=1)
    if norms is not None:
        pts = pts * torch.tensor(norms, dtype=torch.float64)[:, None]
    return pts.to(torch.float32)


# ----------------------------------------------------------------------------------------- random
def test_random_is_deterministic_per_seed_and_leaves_global_rng_alone():
    v, _ = rand_inputs(n=48)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = prune("random", visual=v, budget=9, seed=7)
    b = prune("random", visual=v, budget=9, seed=7)
    assert torch.equal(torch.get_rng_state(), state), "the global RNG must not be touched"
    assert torch.equal(a.order, b.order) and torch.equal(a.scores, b.scores)
    c = prune("random", visual=v, budget=9, seed=8)
    assert not torch.equal(a.keep, c.keep), "different seeds should give different picks"


def test_random_order_follows_its_priorities():
    v, _ = rand_inputs(n=30)
    sel = prune("random", visual=v, budget=10, seed=3)
    pri = sel.scores
    assert torch.all(pri[sel.order][:-1] >= pri[sel.order][1:])  # picked in decreasing priority
    assert float(pri[sel.order].min()) >= float(pri[~torch.isin(torch.arange(30), sel.keep)].max())


def test_random_is_uniform_over_tokens():
    # N=6, K=2: each token is kept with probability 1/3; 600 seeds -> 200 +- 11.5 (1 sigma)
    v = torch.zeros(6, 3)
    counts = torch.zeros(6)
    for seed in range(600):
        counts[prune("random", visual=v, budget=2, seed=seed).keep] += 1
    assert torch.all((counts > 150) & (counts < 250)), counts


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0", 2**63])
def test_random_rejects_bad_seed(seed):
    v, _ = rand_inputs()
    with pytest.raises(ValueError, match="seed"):
        prune("random", visual=v, budget=3, seed=seed)


# ------------------------------------------------------------------------------------- similarity
@pytest.mark.parametrize("aggregation", ["max", "mean"])
def test_similarity_equals_sorted_aggregated_cosine(aggregation):
    v, t = rand_inputs(n=40, d=12, n_t=6, seed=1)
    cos = F.cosine_similarity(v.double()[:, None, :], t.double()[None, :, :], dim=-1)  # (N_V, N_T)
    agg = cos.max(dim=1).values if aggregation == "max" else cos.mean(dim=1)
    want = torch.argsort(agg, descending=True)[:11]
    sel = prune("similarity", visual=v, text=t, budget=11, aggregation=aggregation)
    assert sel.order.tolist() == want.tolist()
    torch.testing.assert_close(sel.scores.double(), agg, atol=1e-5, rtol=0)


def test_similarity_hand_case_max_vs_mean():
    # text: e1 and e2. v0 = e1 (cos 1, 0), v1 = (e1+e2)/sqrt2 (cos .707, .707), v2 = -e1 (cos -1, 0).
    # max: v0 (1) > v1 (.707) > v2 (0);  mean: v1 (.707) > v0 (.5) > v2 (-.5)
    t = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    v = torch.tensor([[2.0, 0.0], [1.0, 1.0], [-3.0, 0.0]])
    assert prune("similarity", visual=v, text=t, budget=3, aggregation="max").order.tolist() == [0, 1, 2]
    assert prune("similarity", visual=v, text=t, budget=3, aggregation="mean").order.tolist() == [1, 0, 2]


def test_similarity_rejects_bad_aggregation():
    v, t = rand_inputs()
    with pytest.raises(ValueError, match="aggregation"):
        prune("similarity", visual=v, text=t, budget=3, aggregation="sum")


# --------------------------------------------------------------------------------------- divprune
def test_divprune_hand_case_2d():
    # angles 0, 10, 90, 180, 200 degrees (norms vary: only the angle matters).
    # nearest-neighbour angle: 10, 10, 80, 20, 20 -> first pick 90deg (idx 2), score 1 - cos 80.
    # angle to {90}: 0->90, 10->80, 180->90, 200->110            -> pick 200 (idx 4), 1 - cos 110
    # angle to {90,200}: 0->90, 10->80, 180->20                    -> pick 0   (idx 0), 1 - cos 90
    # angle to {90,200,0}: 10->10, 180->20                          -> pick 180 (idx 3), 1 - cos 20
    # last: 10deg (idx 1), 1 - cos 10
    v = unit_angles([0, 10, 90, 180, 200], norms=[1.0, 3.0, 5.0, 0.5, 2.0])
    sel = prune("divprune", visual=v, budget=5)
    assert sel.order.tolist() == [2, 4, 0, 3, 1]
    want = {2: 80, 4: 110, 0: 90, 3: 20, 1: 10}
    for i, ang in want.items():
        assert sel.scores[i].item() == pytest.approx(1 - math.cos(math.radians(ang)), abs=1e-5)
    # budget 3: the unpicked get their distance to the final set {90, 200, 0}: 10 -> 10deg, 180 -> 20deg
    sel3 = prune("divprune", visual=v, budget=3)
    assert sel3.order.tolist() == [2, 4, 0]
    assert sel3.scores[1].item() == pytest.approx(1 - math.cos(math.radians(10)), abs=1e-5)
    assert sel3.scores[3].item() == pytest.approx(1 - math.cos(math.radians(20)), abs=1e-5)


def test_divprune_hand_case_3d_first_pick_and_ties():
    # a=e1, b~a (cos .994), c=e2, d=e3, e=-e2.
    # nearest-neighbour distance: a .006, b .006, c 1-.110=.890, d 1, e 1 -> tie d/e, lowest index: d (3)
    # distance to {d}: all 1 -> tie, lowest index a (0)
    # distance to {d,a}: b .006, c 1, e 1 -> c (2);  then to {d,a,c}: b .006, e 1 -> e (4);  then b (1)
    v = torch.tensor([[1.0, 0, 0], [0.9, 0.1, 0], [0, 1.0, 0], [0, 0, 1.0], [0, -1.0, 0]])
    sel = prune("divprune", visual=v, budget=5)
    assert sel.order.tolist() == [3, 0, 2, 4, 1]
    assert sel.scores[3].item() == pytest.approx(1.0, abs=1e-6)
    cos_ab = 0.9 / math.hypot(0.9, 0.1)
    assert sel.scores[1].item() == pytest.approx(1 - cos_ab, abs=1e-5)


def _divprune_reference(v: torch.Tensor, k: int) -> list[int]:
    """The definition, in float64 with the whole distance matrix."""
    u = F.normalize(v.double(), dim=1)
    dist = 1 - u @ u.T
    off = dist + torch.diag(torch.full((len(v),), math.inf, dtype=torch.float64))
    picked = [int(off.min(dim=1).values.argmax())]
    while len(picked) < k:
        m = dist[:, picked].min(dim=1).values
        m[picked] = -math.inf
        picked.append(int(m.argmax()))
    return picked


def test_divprune_matches_reference_on_random_points():
    v, _ = rand_inputs(n=40, d=6, seed=2)
    assert prune("divprune", visual=v, budget=15).order.tolist() == _divprune_reference(v, 15)


def test_divprune_chunked_path_equals_dense(monkeypatch):
    v, _ = rand_inputs(n=37, d=10, seed=3)
    dense = prune("divprune", visual=v, budget=20)
    monkeypatch.setattr(mi, "DENSE_LIMIT", 8)
    monkeypatch.setattr(dvp, "_CHUNK", 5)  # 8 chunks, the last one short

    def no_gram(u):
        raise AssertionError("the N x N matrix must not be built above DENSE_LIMIT")

    monkeypatch.setattr(dvp, "gram", no_gram)
    assert not dvp.CosineColumns(v).dense
    chunked = prune("divprune", visual=v, budget=20)
    assert chunked.order.tolist() == dense.order.tolist()
    torch.testing.assert_close(chunked.scores, dense.scores, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked.extras["nearest_neighbour_distance"],
                               dense.extras["nearest_neighbour_distance"], atol=1e-5, rtol=0)


def test_divprune_single_token():
    sel = prune("divprune", visual=torch.randn(1, 4), budget=1)
    assert sel.order.tolist() == [0] and bool(torch.isfinite(sel.scores).all())


# --------------------------------------------------------------------------------------- cdpruner
def _cdp_kernel(v: torch.Tensor, t: torch.Tensor, theta: float) -> torch.Tensor:
    """The kernel from the formulas, float64: L = diag(q) S diag(q)."""
    u, w = F.normalize(v.double(), dim=1), F.normalize(t.double(), dim=1)
    x = -(u @ w.T).mean(dim=1)  # negative sign, as in the released code
    r = (x - x.min() + 1e-6) / (x.max() - x.min())
    q = r if theta == 1 else torch.exp(theta / (2 * (1 - theta)) * r)
    return q[:, None] * (u @ u.T) * q[None, :]


def _det_ratios(L: torch.Tensor, picked: list[int]) -> dict[int, float]:
    """det(L_{S+i}) / det(L_S) for every i not in S, by brute force."""
    base = torch.det(L[picked][:, picked]) if picked else torch.tensor(1.0, dtype=L.dtype)
    return {i: float(torch.det(L[picked + [i]][:, picked + [i]]) / base) for i in range(len(L)) if i not in picked}


def _greedy_by_determinants(L: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
    """Greedy MAP by brute force: at each step the token maximising det(L_{S+i}) / det(L_S)."""
    picked, gains = [], []
    for _ in range(k):
        ratios = _det_ratios(L, picked)
        best = max(ratios, key=lambda i: (ratios[i], -i))
        picked.append(best)
        gains.append(ratios[best])
    return picked, gains


def _assert_greedy_map(order: list[int], scores: torch.Tensor, L: torch.Tensor, rel: float = 1e-5) -> None:
    """Each pick of `order` maximises det(L_{S+i}) / det(L_S) given the picks before it, up to `rel`
    (a tie up to rounding may go either way), and its score is that ratio. Where the best ratio is
    ahead of the others by more than `rel`, this is exactly "the pick is the brute-force argmax"."""
    for step, j in enumerate(order):
        ratios = _det_ratios(L, order[:step])
        best = max(ratios.values())
        assert ratios[j] >= best - rel * abs(best), f"step {step}: {j} gains {ratios[j]}, the best gains {best}"
        assert float(scores[j]) == pytest.approx(ratios[j], rel=1e-3, abs=1e-6)


def test_cdpruner_hand_case_diversity_beats_relevance():
    # text t = e1. Relevance uses -cos: x = (1, .981, 0, -1) -> r ~ (1, .990, .5, 0);
    # theta = .5 -> alpha = .5, q = exp(r/2), L_ii = q_i^2 = (e, e^.990, e^.5, 1).
    # step 1: v0 (largest L_ii), gain e.
    # step 2: gain_i = q_i^2 (1 - S_0i^2): v1 (near-duplicate of v0, S_01 = 1/sqrt(1.04)) ~ .10,
    #         v2 (orthogonal) e^.5, v3 (= -v0) 0                             -> v2, not v1.
    # step 3: v1 is orthogonal to v2, its gain stays q_1^2 (1 - 1/1.04); step 4: v3 adds no volume.
    # A relevance top-K would give [0, 1, 2, 3]; the positive sign would start from v3.
    t = torch.tensor([[1.0, 0.0, 0.0]])
    v = torch.tensor([[-1.0, 0.0, 0.0], [-1.0, 0.2, 0.0], [0.0, 0.0, 1.0], [2.0, 0.0, 0.0]])
    sel = prune("cdpruner", visual=v, text=t, budget=4, theta=0.5)
    assert sel.order.tolist() == [0, 2, 1, 3]
    r1 = (1 / math.sqrt(1.04) + 1 + 1e-6) / 2
    want = {0: math.exp(1 + 0.5e-6), 2: math.exp(0.5 + 0.5e-6), 1: math.exp(r1) * (1 - 1 / 1.04), 3: 0.0}
    for i, g in want.items():
        assert sel.scores[i].item() == pytest.approx(g, rel=1e-4, abs=1e-5)
    torch.testing.assert_close(sel.extras["relevance"], torch.tensor([1.0, r1, 0.5, 0.0]), atol=1e-5, rtol=0)
    # budget 2 keeps {v0, v2}: the near-duplicate v1 is dropped although it is more relevant (also at
    # the default theta = 1: q = r, gains r_1^2 (1 - 1/1.04) = .04 for v1 against r_2^2 = .25 for v2)
    assert prune("cdpruner", visual=v, text=t, budget=2).keep.tolist() == [0, 2]
    # theta = 1 is the released kernel diag(r) S diag(r); its MinMax keeps the least relevant
    # token's weight at 1e-6 / (max - min) = 5e-7, not 0
    plain = prune("cdpruner", visual=v, text=t, budget=4, theta=1.0)
    assert plain.order.tolist() == [0, 2, 1, 3]
    assert plain.extras["quality"][3].item() == pytest.approx(5e-7, rel=1e-2)


@pytest.mark.parametrize("theta", [0.0, 0.5, 0.9, 1.0])
def test_cdpruner_greedy_equals_brute_force_determinants(theta):
    # theta = 0 weighs every token 1, so L_ii = |v~_i|^2 = 1 for all: the first pick is a tie that
    # rounding decides. The check is tie-invariant: every pick must be a brute-force greedy choice
    # given the picks before it (up to rounding), which for the other thetas means the argmax itself.
    v, t = rand_inputs(n=9, d=6, n_t=3, seed=4)
    L = _cdp_kernel(v, t, theta)
    sel = prune("cdpruner", visual=v, text=t, budget=5, theta=theta)
    _assert_greedy_map(sel.order.tolist(), sel.scores, L)
    if theta > 0:  # no ties here: the whole order is the brute force's
        want, gains = _greedy_by_determinants(L, 5)
        assert sel.order.tolist() == want
        torch.testing.assert_close(sel.scores[want].double(), torch.tensor(gains, dtype=torch.float64),
                                   rtol=1e-3, atol=1e-6)


def test_incremental_cholesky_gains_equal_determinant_ratios():
    g = torch.Generator().manual_seed(5)
    a = torch.randn(7, 7, generator=g, dtype=torch.float64)
    L = a @ a.T / 7 + 0.1 * torch.eye(7, dtype=torch.float64)  # random SPD kernel
    order, scores = cdp.greedy_map(lambda j: L[j].float(), torch.diagonal(L).float(), 4,
                                   fallback=torch.zeros(7))
    want, gains = _greedy_by_determinants(L, 4)
    assert order.tolist() == want
    torch.testing.assert_close(scores[want].double(), torch.tensor(gains, dtype=torch.float64), rtol=1e-4, atol=0)
    # an unpicked token's score is its gain given the final set: det(L_{S+i}) / det(L_S)
    base = torch.det(L[want][:, want])
    for i in set(range(7)) - set(want):
        s = want + [i]
        assert scores[i].item() == pytest.approx(float(torch.det(L[s][:, s]) / base), rel=1e-4)


def test_cdpruner_rank_exhaustion_falls_back_to_relevance():
    # 6 tokens in 2-D: rank 2, so after two picks nothing adds volume; the rest go by relevance q.
    t = torch.tensor([[1.0, 0.0]])
    v = unit_angles([100, 170, 120, 200, 150, 90])  # -cos(angle): the larger the angle, the more relevant
    sel = prune("cdpruner", visual=v, text=t, budget=6, theta=0.5)
    rest = sel.order[2:].tolist()
    x = [-math.cos(math.radians(a)) for a in [100, 170, 120, 200, 150, 90]]
    assert rest == sorted(rest, key=lambda i: -x[i])
    assert sorted(sel.order.tolist()) == list(range(6)) and bool(torch.isfinite(sel.scores).all())
    assert torch.all(sel.scores[sel.order[2:]] < 1e-4)


def test_cdpruner_on_demand_columns_equal_dense(monkeypatch):
    v, t = rand_inputs(n=30, d=12, n_t=4, seed=6)
    dense = prune("cdpruner", visual=v, text=t, budget=12)
    monkeypatch.setattr(mi, "DENSE_LIMIT", 8)
    monkeypatch.setattr(dvp, "gram", lambda u: (_ for _ in ()).throw(AssertionError("dense")))
    lazy = prune("cdpruner", visual=v, text=t, budget=12)
    assert lazy.order.tolist() == dense.order.tolist()
    torch.testing.assert_close(lazy.scores, dense.scores, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("theta", [-0.1, 1.5, float("nan"), "a"])
def test_cdpruner_rejects_bad_theta(theta):
    v, t = rand_inputs()
    with pytest.raises(ValueError, match="theta"):
        prune("cdpruner", visual=v, text=t, budget=3, theta=theta)


# ------------------------------------------------------------------------------------------ shared
@pytest.mark.parametrize("name", NAMES)
def test_degenerate_inputs_stay_finite(name):
    v, t = rand_inputs(n=16, d=4)
    v[:4] = 0.0
    v[4:8] = v[8]  # duplicates
    for visual in (v, torch.zeros(16, 4), v.to(torch.float16), v.to(torch.bfloat16)):
        sel = prune(name, visual=visual, text=t, budget=16)
        assert sel.keep.tolist() == list(range(16))
        assert sel.scores.dtype == torch.float32 and bool(torch.isfinite(sel.scores).all())
        assert sel.order.dtype == torch.long and sel.keep.dtype == torch.long
