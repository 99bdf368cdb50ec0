"""MI-Pruner ("MI-Pruner: Crossmodal Mutual Information-guided Token Pruner for Efficient MLLMs",
Li, Tiulpin & Blaschko; the paper's Sec. 3.2, Alg. 1; App. B.2 for MinMax).

    v~, t~            L2-normalised rows of V (N_V, d) and T (N_T, d)
    rho_cross = v~ t~^T / tau   (N_V, N_T)       rho_self = v~ v~^T / tau   (N_V, N_V)
    p(t_j|v_i) = softmax_j rho_cross              p(v_j|v_i) = softmax_j rho_self
    p(v_j) = 1/N_V                                p(t_j) = (1/N_V) sum_i p(t_j|v_i)
    PMI_cross(i,j) = log p(t_j|v_i) - log p(t_j)  PMI_self(i,j) = log p(v_j|v_i) + log N_V
    S_cross_i = max_j PMI_cross(i,j)   ("max")  or  sum_j p(t_j|v_i) PMI_cross(i,j)  ("mean")
    greedy:  S_i = lam * S_cross_i - (1 - lam) * S_self_i,   S_self_i = 0 while nothing is kept,
             S_self_i = max_{j in kept} PMI_self(i,j)   ("max")
                     or sum_{j in kept} w_ij PMI_self(i,j)   ("mean"; w_ij below)
    pivot word of patch i = argmax_j PMI_cross(i,j)

Two choices the paper leaves open, and how we read them (both change selections):
  * The redundancy while nothing is kept. Alg. 1 takes max_{j in V_S} PMI_self over V_S = {} at
    the first step; the maximum of an empty set is -inf by convention, which would make every
    gain +inf and the first pick arbitrary (index 0 under our lowest-index tie rule). We read it
    as an empty sum, S_self = 0 (what Eq. 11's global aggregation gives), so the first pick is the
    most relevant token, the same whatever lam. No option: any constant picks the same token.
  * For aggregation="mean" (Eq. 11, "averaging over ... selected image tokens") with lam < 1:
    over which tokens p(v_j|v_i), the weight w_ij, is normalised. `mean_weights="all"` (default,
    Eq. 7 as written): w_ij = p(v_j|v_i) = softmax over all N_V tokens, so the weights over the
    kept set sum to less than 1 and S_self grows with every pick. `mean_weights="kept"`: w_ij =
    p(v_j|v_i) / sum_{k in kept} p(v_k|v_i) = softmax_{j in kept} rho_self(i,j), a weighted mean
    over the kept set ("consensus") whose weights sum to 1; with one token kept it equals "max".
    In both, the averaged values are Eq. 8's PMI_self (p(v_j|v_i) over all N_V, p(v_j) = 1/N_V),
    so only the weights differ. (Renormalising the PMI itself too, with p(v_j) = 1/|kept|, would
    score how peaked p(.|v_i) is over the kept set, not how close v_i is to it; not offered.)
    With "max", or lam = 1, mean_weights has no effect.

What depends on what (so callers can cache across slider moves):
  * the cross PMI depends only on (V, T, tau, normalization)              -> `cross_pmi`
  * the self-PMI row normaliser depends only on (V, tau, normalization)   -> `SelfPMI`
  * lambda, aggregation and the budget only change the cheap selection step.
Pass the same dict as `cache=` to `prune("mi", ...)` for one (V, T) pair and both are reused.

lam == 1 is a plain top-K of S_cross: O(N_V N_T d) scoring plus a stable sort, no N_V x N_V work.
lam < 1 needs each candidate's self-PMI row normaliser, i.e. every row of v~ v~^T: O(N_V^2 d) once,
then O(N_V) per greedy step. Up to `DENSE_LIMIT` tokens the Gram matrix is held and its columns are
reused; above it, rows are processed in chunks and columns are recomputed per step (O(N_V d)).
Everything runs on the inputs' device; a greedy step is a few (N_V,) kernels and no host copy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._registry import Param, register_pruner
from .capture import Capturable
from .lam_rule import LAM_RULE
from .mi_greedy import Redundancy, greedy_select  # noqa: F401  (the greedy step, used here and re-exported)
from .selection import Selection, cosine_to, gram, top_indices, unit_rows

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
MEAN_WEIGHTS_CHOICES = ("all", "kept")  # see the module docstring: how the "mean" redundancy is weighted
MEAN_WEIGHTS = Param.choice("mean_weights", "all", MEAN_WEIGHTS_CHOICES, "aggregation=mean with lam<1: the "
                            "redundancy's weights p(v_j|v_i) normalised over all tokens (all, as Eq. 7) or over "
                            "the kept set (kept: a weighted mean)", code="mw")
MI_PARAMS = (LAM, TAU, AGGREGATION, NORMALIZATION, MEAN_WEIGHTS)
DENSE_LIMIT = 4096  # above this many visual tokens the N_V x N_V matrix is never held whole
_CHUNK = 1024  # rows per chunk when the Gram matrix is not held
_TINY = torch.finfo(torch.float32).tiny  # floor for log(p) where MinMax gives p = 0
_SNAP = 64  # MinMax: entries this many units (eps x the row's largest |rho|) above the row's minimum are it


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


def _logsumexp_rows_(x: torch.Tensor) -> torch.Tensor:
    """torch.logsumexp(x, dim=1), bit for bit (max, exp of the difference, sum, log, plus the max),
    computed in place in x, which it overwrites: half the time of the library call on an N x N
    matrix, which allocates a temporary per step."""
    top = x.amax(dim=1)  # (n,)
    top = top.masked_fill(torch.isinf(top), 0.0)  # an all -inf (or +inf) row: as torch.logsumexp
    return x.sub_(top[:, None]).exp_().sum(dim=1).log_().add_(top)


def _minmax_log_p(rho: torch.Tensor, row_min: torch.Tensor, row_rng: torch.Tensor,
                  row_sum: torch.Tensor) -> torch.Tensor:
    """log of Eq. (16)-(17): p_ij = ((rho_ij - min_i) / (max_i - min_i)) / Z_i, floored at tiny.

    An entry within rounding noise of its row's minimum (_SNAP units of the row's largest |rho|) is
    the minimum: p = 0, floored at tiny. Without this the floor would amplify noise: the chunked
    self-PMI takes a row's minimum from one matrix product and its entries from another, and an
    entry that is the minimum came out 1 ulp above it on some CPUs (log p -18 instead of -87).
    """
    diff = rho - row_min[:, None]
    noise = _SNAP * torch.finfo(rho.dtype).eps * torch.maximum(row_min.abs(), (row_min + row_rng).abs())
    diff = torch.where(diff > noise[:, None], diff, torch.zeros_like(diff))
    hat = torch.where(row_rng[:, None] > 0, diff / row_rng.clamp_min(_TINY)[:, None],
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
        if self.cos is not None:
            rho = self.cos / self.tau
            return [_logsumexp_rows_(rho)] if self.normalization == "softmax" else _minmax_stats(rho)
        dev = self.u.device
        lse = torch.full((n,), -math.inf, device=dev)
        lo, hi = torch.full((n,), math.inf, device=dev), torch.full((n,), -math.inf, device=dev)
        tot = torch.zeros(n, device=dev)

        def update(rows: slice, rho: torch.Tensor) -> None:  # rho (len(rows), m): a part of these rows
            if self.normalization == "softmax":
                lse[rows] = torch.logaddexp(lse[rows], torch.logsumexp(rho, dim=1))
            else:
                lo[rows] = torch.minimum(lo[rows], rho.min(dim=1).values)
                hi[rows] = torch.maximum(hi[rows], rho.max(dim=1).values)
                tot[rows] += rho.sum(dim=1)

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
        rho_t = cos_t / self.tau  # a fresh tensor: the softmax case works in place
        if self.normalization == "softmax":
            return rho_t.sub_(self.stats[0][None, :])
        return _minmax_log_p(rho_t.T, *self.stats).T

    def _terms_t(self, cos_t: torch.Tensor, aggregation: str) -> torch.Tensor:
        log_p = self._log_p_t(cos_t)  # (m, N_V), fresh
        if aggregation == "max":
            return log_p.add_(self.log_n)  # PMI_self(i, j) = log p(v_j|v_i) - log(1/N_V)
        return log_p.exp() * (log_p + self.log_n)  # "mean": p(v_j|v_i) * PMI, Eq. 11

    def rows(self, idx: torch.Tensor, aggregation: str = "max") -> torch.Tensor:
        """What each selected token idx[r] contributes to every candidate's redundancy: (m, N_V).

        aggregation "max": PMI_self(i, idx[r]); "mean": p(v_idx[r]|v_i) PMI_self(i, idx[r]).
        idx: (m,) int64 on the inputs' device; no host copy.
        """
        if self.cos is None:
            return self._terms_t(self.u.index_select(0, idx) @ self.u.T, aggregation)  # (m, d) @ (d, N_V)
        return self.table(aggregation).index_select(0, idx)

    def table(self, aggregation: str = "max") -> torch.Tensor | None:
        """The whole (N_V, N_V) matrix whose rows `rows` reads (row j: token j's contribution), or None
        above DENSE_LIMIT, where it is never held."""
        if self.cos is None:
            return None
        if aggregation not in self._dense:
            self._dense[aggregation] = self._terms_t(self.cos, aggregation)  # (N_V, N_V), uses cos = cos.T
        return self._dense[aggregation]

    def term(self, j: int, aggregation: str = "max") -> torch.Tensor:
        """What selected token j contributes to every candidate's redundancy: (N_V,)."""
        return self.rows(torch.tensor([int(j)], device=self.u.device), aggregation)[0]

    def pmi_col(self, j: int) -> torch.Tensor:
        """PMI_self(i, j) for every row i: (N_V,)."""
        return self.term(j, "max")


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


@register_pruner("mi", needs=("text",), capture=Capturable(), params=(*MI_PARAMS, LAM_RULE), label="MI-Pruner",
                 is_mi=True, score_label="greedy MI gain (nats)")
def mi_pruner(visual: torch.Tensor, text: torch.Tensor, budget: int, *,
              lam: float = 0.5,  # paper Sec. 4.4: 0.5 for open-ended questions, 1 for closed-form
              tau: float = 0.1,  # paper Tab. 4: best of {0.01, 0.1, 0.5}
              aggregation: str = "max",  # paper Fig. 5a: max beats the global (mean) aggregation
              normalization: str = "softmax",  # paper App. B.2: softmax beats MinMax
              mean_weights: str = "all",  # left open by the paper; "all" = Eq. 7 as written
              lam_rule: str = "auto",  # applied by mipruner.select from the prompt (lam_rule.py)
              cache: dict | None = None) -> Selection:
    """MI-Pruner: maximise PMI with the prompt, minus PMI with what is already kept (paper Alg. 1)."""
    cross = _cached(cache, visual, text, ("cross", tau, normalization),
                    lambda: cross_pmi(visual, text, tau, normalization))
    relevance = cross.relevance(aggregation)  # (N_V,)
    extras = {"relevance": relevance}
    if lam == 1.0:
        order = top_indices(relevance, budget)  # modular objective: a sort, no N_V^2 work; ties to the lowest index
        scores = relevance
    else:
        self_pmi = _cached(cache, visual, text, ("self", tau, normalization),
                           lambda: SelfPMI(visual, tau, normalization))
        order, scores, extras["redundancy"] = greedy_select(relevance, self_pmi, budget, lam, aggregation,
                                                            mean_weights=mean_weights)
    return Selection.from_order(order, scores, pmi=cross.pmi, pivot=cross.pivot, extras=extras)
