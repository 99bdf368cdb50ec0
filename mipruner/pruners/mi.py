"""MI-Pruner (paper Sec. 3.2, Alg. 1; App. B.2 for MinMax).

    v~, t~            L2-normalised rows of V (N_V, d) and T (N_T, d)
    rho_cross = v~ t~^T / tau   (N_V, N_T)       rho_self = v~ v~^T / tau   (N_V, N_V)
    p(t_j|v_i) = softmax_j rho_cross              p(v_j|v_i) = softmax_j rho_self
    p(v_j) = 1/N_V                                p(t_j) = (1/N_V) sum_i p(t_j|v_i)
    PMI_cross(i,j) = log p(t_j|v_i) - log p(t_j)  PMI_self(i,j) = log p(v_j|v_i) + log N_V
    S_cross_i = max_j PMI_cross(i,j)   ("max")  or  sum_j p(t_j|v_i) PMI_cross(i,j)  ("mean")
    greedy:  S_i = lam * S_cross_i - (1 - lam) * agg_{j in selected} PMI_self(i,j)   (0 while empty)
    pivot word of patch i = argmax_j PMI_cross(i,j)

What depends on what (so callers can cache across slider moves):
  * the cross PMI depends only on (V, T, tau, normalization)              -> `cross_pmi`
  * the self-PMI row normaliser depends only on (V, tau, normalization)   -> `SelfPMI`
  * lambda, aggregation and the budget only change the cheap selection step.
Pass the same dict as `cache=` to `prune("mi", ...)` for one (V, T) pair and both are reused.

lam == 1 is a plain top-K of S_cross: O(N_V N_T d) scoring plus `torch.topk`, no N_V x N_V work.
lam < 1 needs each candidate's self-PMI row normaliser, i.e. every row of v~ v~^T: O(N_V^2 d) once,
then O(N_V) per greedy step. Up to `DENSE_LIMIT` tokens the Gram matrix is held and its columns are
reused; above it, rows are processed in chunks and columns are recomputed per step (O(N_V d)).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._registry import Param, register_pruner
from .lam_rule import LAM_RULE
from .selection import Selection, check_choice, check_range, cosine_to, gram, unit_rows

NORMALIZATIONS = ("softmax", "minmax")  # softmax: Eq. 7 (default); minmax: App. B.2 ablation
AGGREGATIONS = ("max", "mean")  # max: Eq. 9-10 (default); mean: Eq. 11, the paper's "global"

# The MI parameters, shared by `mi` and `mi_attention` (one definition, one control in the app).
LAM = Param.real("lam", 0.5, 0.0, 1.0, "1 = relevance only; lower trades relevance for diversity "
                 "(paper Sec. 4.4: 1 for closed-form questions, 0.5 for open ones)", step=0.05)
TAU = Param.real("tau", 0.1, 0.0, 1.0, "PMI temperature (paper Tab. 4: best of 0.01, 0.1, 0.5)", low_open=True,
                 step=0.01)
AGGREGATION = Param.choice("aggregation", "max", AGGREGATIONS, "over prompt tokens: best word (max) or "
                           "expected PMI (mean, the paper's global)", code="agg")
NORMALIZATION = Param.choice("normalization", "softmax", NORMALIZATIONS, "softmax (Eq. 7) or MinMax "
                             "(App. B.2 ablation)", code="norm")
MI_PARAMS = (LAM, TAU, AGGREGATION, NORMALIZATION)
DENSE_LIMIT = 4096  # above this many visual tokens the N_V x N_V matrix is never held whole
_CHUNK = 1024  # rows per chunk when the Gram matrix is not held
_TINY = torch.finfo(torch.float32).tiny  # floor for log(p) where MinMax gives p = 0


@dataclass
class CrossPMI:
    """Cross-modal PMI of one (V, T, tau, normalization): log p(t_j|v_i) and PMI, both (N_V, N_T)."""

    log_p: torch.Tensor
    pmi: torch.Tensor

    def relevance(self, aggregation: str) -> torch.Tensor:
        """S_cross (N_V,): max_j PMI, or the p(t_j|v_i)-weighted sum of PMI ("mean")."""
        if aggregation == "max":
            return self.pmi.max(dim=1).values
        return (self.log_p.exp() * self.pmi).sum(dim=1)

    @property
    def pivot(self) -> torch.Tensor:
        return self.pmi.argmax(dim=1)


def _minmax_log_p(rho: torch.Tensor, row_min: torch.Tensor, row_rng: torch.Tensor,
                  row_sum: torch.Tensor) -> torch.Tensor:
    """log of Eq. (16)-(17): p_ij = ((rho_ij - min_i) / (max_i - min_i)) / Z_i, floored at tiny."""
    hat = torch.where(row_rng[:, None] > 0, (rho - row_min[:, None]) / row_rng.clamp_min(_TINY)[:, None],
                      torch.ones_like(rho))  # a constant row is uniform
    return torch.log((hat / row_sum[:, None]).clamp_min(_TINY))


def _minmax_finish(lo: torch.Tensor, hi: torch.Tensor, tot: torch.Tensor, n: int) -> list[torch.Tensor]:
    """MinMax row normaliser from each row's min, max and plain sum over its n entries:
    (min, range, Z) with Z = sum_j (rho_ij - min) / range = (sum - n min) / range; a constant row
    is uniform (every normalised entry 1, Z = n)."""
    rng = hi - lo
    z = torch.where(rng > 0, (tot - n * lo) / rng.clamp_min(_TINY), torch.full_like(lo, float(n)))
    return [lo, rng, z]


def _minmax_stats(rho: torch.Tensor) -> list[torch.Tensor]:
    return _minmax_finish(rho.min(dim=1).values, rho.max(dim=1).values, rho.sum(dim=1), rho.shape[1])


def cross_pmi(visual: torch.Tensor, text: torch.Tensor, tau: float = 0.1,
              normalization: str = "softmax") -> CrossPMI:
    """Cross-modal PMI (N_V, N_T). Depends only on (V, T, tau, normalization): cache it."""
    rho = cosine_to(visual, text) / tau  # (N_V, N_T)
    n_v = rho.shape[0]
    if normalization == "softmax":
        log_p = torch.log_softmax(rho, dim=1)  # log p(t_j|v_i)
        log_pt = torch.logsumexp(log_p, dim=0) - math.log(n_v)  # (N_T,) log p(t_j), total probability
    else:
        log_p = _minmax_log_p(rho, *_minmax_stats(rho))
        log_pt = torch.log(log_p.exp().mean(dim=0).clamp_min(_TINY))
    return CrossPMI(log_p=log_p, pmi=log_p - log_pt[None, :])


class SelfPMI:
    """Visual self-PMI, one selected token at a time. Built once per (V, tau, normalization): cache it.

    Holds each row's normaliser of rho_self (softmax: log-sum-exp; MinMax: min, range, sum). For
    N_V <= DENSE_LIMIT it also holds, per aggregation, the matrix R[j, i] = the redundancy that a
    selected token j adds to candidate i (the transpose of PMI_self, so row j is contiguous), and a
    greedy step costs one row read. Above DENSE_LIMIT the column is recomputed: O(N_V d) a step.
    """

    def __init__(self, visual: torch.Tensor, tau: float = 0.1, normalization: str = "softmax"):
        self.u = unit_rows(visual)  # (N_V, d)
        self.tau, self.normalization = float(tau), normalization
        n = self.u.shape[0]
        self.log_n = math.log(n)
        self.cos = gram(self.u) if n <= DENSE_LIMIT else None  # (N_V, N_V) symmetric, or None
        self.stats = self._row_stats(n)  # each (N_V,)
        self._dense: dict[str, torch.Tensor] = {}

    def _row_stats(self, n: int) -> list[torch.Tensor]:
        """Per-row normaliser of rho_self = cos / tau, from decomposable running statistics.

        softmax: log-sum-exp. MinMax: min, range and sum_j (rho_ij - min_i) / range_i, which is
        (sum_j rho_ij - N min_i) / range_i, so min, max and the plain row sum suffice. Without the
        dense matrix, blocks (a, b) with a <= b are computed once and serve the rows of a (over
        b's columns) and, transposed, the rows of b: half the flops of a row-by-row pass.
        """
        lse = torch.full((n,), -math.inf)
        lo, hi, tot = torch.full((n,), math.inf), torch.full((n,), -math.inf), torch.zeros(n)

        def update(rows: slice, rho: torch.Tensor) -> None:  # rho (len(rows), m): a part of these rows
            if self.normalization == "softmax":
                lse[rows] = torch.logaddexp(lse[rows], torch.logsumexp(rho, dim=1))
            else:
                lo[rows] = torch.minimum(lo[rows], rho.min(dim=1).values)
                hi[rows] = torch.maximum(hi[rows], rho.max(dim=1).values)
                tot[rows] += rho.sum(dim=1)

        if self.cos is not None:
            update(slice(0, n), self.cos / self.tau)
        else:
            for a in range(0, n, _CHUNK):
                ra = slice(a, min(n, a + _CHUNK))
                for b in range(a, n, _CHUNK):
                    rb = slice(b, min(n, b + _CHUNK))
                    rho = (self.u[ra] @ self.u[rb].T) / self.tau  # (chunk, chunk) block of rho_self
                    update(ra, rho)
                    if b != a:
                        update(rb, rho.T)
        return [lse] if self.normalization == "softmax" else _minmax_finish(lo, hi, tot, n)

    def _log_p_t(self, cos_t: torch.Tensor) -> torch.Tensor:
        """log p(v_j | v_i) laid out as [j, i], from cos_t[j, i] = cos(v_i, v_j): (m, N_V)."""
        rho_t = cos_t / self.tau
        if self.normalization == "softmax":
            return rho_t - self.stats[0][None, :]
        return _minmax_log_p(rho_t.T, *self.stats).T

    def _terms_t(self, cos_t: torch.Tensor, aggregation: str) -> torch.Tensor:
        log_p = self._log_p_t(cos_t)
        pmi = log_p + self.log_n  # PMI_self(i, j) = log p(v_j|v_i) - log(1/N_V)
        return pmi if aggregation == "max" else log_p.exp() * pmi  # "mean": p(v_j|v_i) * PMI, Eq. 11

    def term(self, j: int, aggregation: str = "max") -> torch.Tensor:
        """What selected token j contributes to every candidate's redundancy: (N_V,)."""
        if self.cos is None:
            return self._terms_t((self.u @ self.u[j])[None, :], aggregation)[0]
        if aggregation not in self._dense:
            self._dense[aggregation] = self._terms_t(self.cos, aggregation)  # (N_V, N_V), uses cos = cos.T
        return self._dense[aggregation][j]

    def pmi_col(self, j: int) -> torch.Tensor:
        """PMI_self(i, j) for every row i: (N_V,)."""
        return self.term(j, "max")


def greedy_select(relevance: torch.Tensor, self_pmi: SelfPMI, k: int, lam: float,
                  aggregation: str = "max", init: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Alg. 1's greedy: pick argmax S_i = lam*S_cross_i - (1-lam)*S_self_i, k times.

    `init`: indices already selected (MI-Attention's round 1); they seed the redundancy term and
    are not returned. Returns (order (k,), scores (N_V,), redundancy (N_V,)); a picked token's
    score is its gain when picked, an `init` token's lam * S_cross, the others' their gain given
    the final selected set.
    Ties go to the lowest index (torch.argmax returns the first maximum).
    """
    n = relevance.shape[0]
    base = lam * relevance  # (N_V,)
    red = torch.zeros(n)
    taken = torch.zeros(n, dtype=torch.bool)
    have_any = False

    def add(j: int) -> None:
        nonlocal red, have_any
        t = self_pmi.term(j, aggregation)
        red = t.clone() if not have_any else (torch.maximum(red, t) if aggregation == "max" else red + t)
        taken[j] = True
        have_any = True

    scores = base.clone()  # `init` tokens keep lam * S_cross, their gain with nothing selected
    for j in ([] if init is None else init.tolist()):
        add(int(j))
    order = torch.empty(k, dtype=torch.long)
    for step in range(k):
        gain = base - (1.0 - lam) * red if have_any else base.clone()
        g = gain.masked_fill_(taken, -math.inf) if have_any else gain
        j = int(g.argmax())
        order[step], scores[j] = j, gain[j]
        add(j)
    final = base - (1.0 - lam) * red
    scores[~taken] = final[~taken]
    return order, scores, red


def _cached(cache: dict | None, visual: torch.Tensor, text: torch.Tensor | None, key: tuple, make):
    """Memoise `make()` in a caller-owned dict tied to one (visual, text) pair."""
    if cache is None:
        return make()
    owner = cache.setdefault("_tensors", (visual, text))
    if owner[0] is not visual or (text is not None and owner[1] is not None and owner[1] is not text):
        raise ValueError("cache= belongs to other visual/text tensors; use one dict per encoding")
    if key not in cache:
        cache[key] = make()
    return cache[key]


def mi_params(lam: float, tau: float, aggregation: str, normalization: str) -> tuple[float, float]:
    lam = check_range("lam", lam, 0.0, 1.0)
    tau = check_range("tau", tau, 0.0, math.inf, lo_open=True)
    if math.isinf(tau):
        raise ValueError("tau must be finite")
    check_choice("aggregation", aggregation, AGGREGATIONS)
    check_choice("normalization", normalization, NORMALIZATIONS)
    return lam, tau


@register_pruner("mi", needs=("text",), params=(*MI_PARAMS, LAM_RULE), label="MI-Pruner", is_mi=True)
def mi_pruner(visual: torch.Tensor, text: torch.Tensor, budget: int, *,
              lam: float = 0.5,  # paper Sec. 4.4: 0.5 for open-ended questions, 1 for closed-form
              tau: float = 0.1,  # paper Tab. 4: best of {0.01, 0.1, 0.5}
              aggregation: str = "max",  # paper Fig. 5a: max beats the global (mean) aggregation
              normalization: str = "softmax",  # paper App. B.2: softmax beats MinMax
              lam_rule: str = "auto",  # applied by mipruner.select from the prompt (lam_rule.py)
              cache: dict | None = None) -> Selection:
    """MI-Pruner: maximise PMI with the prompt, minus PMI with what is already kept (paper Alg. 1)."""
    lam, tau = mi_params(lam, tau, aggregation, normalization)
    cross = _cached(cache, visual, text, ("cross", tau, normalization),
                    lambda: cross_pmi(visual, text, tau, normalization))
    relevance = cross.relevance(aggregation)  # (N_V,)
    extras = {"relevance": relevance}
    if lam == 1.0:
        order = torch.topk(relevance, budget).indices  # modular objective: a sort, no N_V^2 work
        scores = relevance
    else:
        self_pmi = _cached(cache, visual, text, ("self", tau, normalization),
                           lambda: SelfPMI(visual, tau, normalization))
        order, scores, extras["redundancy"] = greedy_select(relevance, self_pmi, budget, lam, aggregation)
    return Selection.from_order(order, scores, pmi=cross.pmi, pivot=cross.pivot, extras=extras)
