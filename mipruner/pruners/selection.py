"""The `Selection` record every pruner returns, and the input checks they share.

Pruners are pure functions on tensors: they never see a model, a file or the UI. All numeric work
runs in float32 whatever the input dtype (fp16/bf16 inputs are upcast), and rows of zero norm are
normalised to zero vectors (cosine 0 with everything) instead of producing NaN.

Devices: a pruner computes on the device of its `visual` input, creates every tensor there
(`device=` taken from the inputs), and never copies to the host inside a selection: a Selection's
tensors stay on that device. Code that shows a selection (viz, JSON export, an adapter's
`keep_indices`) copies what it reads once, with `.cpu()`/`.tolist()`, or calls `Selection.to("cpu")`.
On a GPU, selecting therefore queues kernels without waiting for them; the first host read waits.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class Selection:
    """Which visual tokens a pruner keeps, and why.

    keep:   (K,) int64, ascending and unique: indices into the N_V visual tokens, original order.
    order:  (K,) int64, the same indices in the order the method picked them.
    scores: (N_V,) float32, the score the method ranked by (for greedy methods: the marginal gain
            at the step a token was picked; for tokens never picked, their gain at the last step).
    pmi:    (N_V, N_T) cross-modal PMI for MI methods, else None.
    pivot:  (N_V,) int64 index of each patch's pivot text token (argmax_j PMI), MI methods only.
    tokens: (K, d) replacement tokens for methods that merge (VisionZip), in `keep` order, else None.
    extras: method-specific tensors worth showing (e.g. MI's relevance and redundancy terms).
    prefix: (P, d) rows the LLM reads before the kept visual tokens that belong to no visual position
            (VisionZip's projected [CLS]), else None. `keep` (what masks show) excludes them; `budget`
            counts them, since they reach the LLM.
    merged_into: (N_V,) int64 for merging methods: the kept token (an index into N_V, one of `keep`)
            each dropped token went into, -1 for the others (kept ones included); else None. The
            app draws it (which dropped patches went into which kept one).
    positions: the 1-D position rule the method's release feeds the LLM ("original": each kept token at its
            position in the unpruned prompt, as FastVID's release does), else None (the adapter's own rule,
            "compact" by default). An explicit `positions=` of an answer call overrides it; M-RoPE families
            (Qwen) always keep their unpruned columns.

    Every tensor lives on the device the pruner computed on (that of its `visual` input); nothing
    is copied to the host when a selection is made (see the module docstring).
    """

    keep: torch.Tensor
    order: torch.Tensor
    scores: torch.Tensor
    pmi: torch.Tensor | None = None
    pivot: torch.Tensor | None = None
    tokens: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    method: str = ""
    prefix: torch.Tensor | None = None
    merged_into: torch.Tensor | None = None
    positions: str | None = None

    @property
    def budget(self) -> int:
        """Visual tokens that reach the LLM: the kept ones plus any `prefix` rows."""
        return int(self.keep.numel()) + (0 if self.prefix is None else int(self.prefix.shape[0]))

    @property
    def device(self) -> torch.device:
        return self.keep.device

    @classmethod
    def from_order(cls, order: torch.Tensor, scores: torch.Tensor, **kw) -> "Selection":
        """Build a Selection from the pick order; `keep` is the sorted copy. No host copy: the
        tensors stay on their device (order and scores must share one)."""
        order = order.to(torch.long).flatten()
        keep, _ = torch.sort(order)
        return cls(keep=keep, order=order, scores=scores.detach().to(torch.float32), **kw)

    def to(self, device: torch.device | str) -> "Selection":
        """A copy with every tensor (extras included) on `device`; `self` when already there."""
        device = torch.device(device)
        if self.keep.device == device:
            return self
        move = lambda x: x.to(device) if isinstance(x, torch.Tensor) else x  # noqa: E731
        return Selection(keep=move(self.keep), order=move(self.order), scores=move(self.scores), pmi=move(self.pmi),
                         pivot=move(self.pivot), tokens=move(self.tokens), prefix=move(self.prefix),
                         merged_into=move(self.merged_into),
                         extras={k: move(v) for k, v in self.extras.items()}, method=self.method,
                         positions=self.positions)


def withdrawn_at(sel: Any) -> int | None:
    """The decoder layer from which an in-LLM selection withdraws every visual token (its last stage
    keeps none, `extras["withdrawn_at"]`), else None."""
    extras = getattr(sel, "extras", None)
    layer = extras.get("withdrawn_at") if isinstance(extras, dict) else None
    return None if layer is None else int(layer)


def size_rule(k: int, *, adaptive: bool = False, stage: str | None = None, empty: bool = False) -> str:
    """The rule on how many visual tokens a selection keeps, as one clause of a contract error
    (empty: it kept none, which only an in-LLM stage may)."""
    rule = (f"an adaptive method keeps between 1 and K = {k} tokens (the budget is its cap)" if adaptive
            else f"a fixed-K method keeps exactly K = {k} tokens")
    if stage == "llm":
        return rule + ", or none when a stage withdraws every visual token (run.keep(view, []))"
    if stage is not None and empty:
        return rule + ("; a pre-LLM method keeps at least one, since the LLM would read nothing of the media "
                       "(only a stage inside the LLM may withdraw every visual token, after layers that read them)")
    return rule


def selection_failures(sel: Any, *, n: int, k: int, device: torch.device | None = None, adaptive: bool = False,
                       stage: str | None = None) -> list[str]:
    """What is wrong with `sel` as a selection of `k` of `n` visual tokens (empty: nothing), one
    sentence each: its type, the shapes and dtypes of keep / order / scores / tokens, duplicate or
    out-of-range indices, and (given `device`) tensors off the inputs' device. Never raises.

    The size rule (`size_rule`, stated in the sentence): exactly `k` tokens (`prefix` rows counted), or
    with `adaptive` between 1 and `k`; with stage "llm" also none, when its last stage withdraws every
    visual token (`withdrawn_at`); a pre-LLM method (any other stage) never keeps none."""
    if not isinstance(sel, Selection):
        return [f"it returned {type(sel).__name__}, not a Selection"]
    out = []
    for name in ("keep", "order", "scores"):
        if not isinstance(getattr(sel, name), torch.Tensor):
            out.append(f"its {name} is {type(getattr(sel, name)).__name__}, not a tensor")
    if out:
        return out
    keep, order, scores = sel.keep, sel.order, sel.scores
    n_pre = 0 if sel.prefix is None else int(sel.prefix.shape[0])  # rows with no position count
    n_keep = k - n_pre
    if keep.ndim == 1 and (adaptive and 1 <= keep.numel() + n_pre <= k
                           or stage == "llm" and keep.numel() == 0 and withdrawn_at(sel) is not None):
        n_keep = int(keep.numel())  # within the rule: checked at the size it chose
    if keep.dtype != torch.long or order.dtype != torch.long:
        out.append(f"keep and order must be int64, got {keep.dtype} and {order.dtype}")
    if tuple(keep.shape) != (n_keep,):
        out.append(f"keep has shape {tuple(keep.shape)} for a budget of {k} tokens (expected "
                   + (f"1 to {k - n_pre}" if adaptive else f"({n_keep},)")
                   + f": {size_rule(k, adaptive=adaptive, stage=stage, empty=keep.numel() == 0)})")
    elif "meta" in (keep.device.type, order.device.type):
        out.append("keep or order is a meta tensor (a tensor was made without device=)")
    elif n_keep:
        keep_cpu = keep.detach().cpu()
        if not bool((keep_cpu[1:] > keep_cpu[:-1]).all()):
            out.append("keep is not ascending and unique (duplicate or unsorted indices)")
        if int(keep_cpu.min()) < 0 or int(keep_cpu.max()) >= n:
            out.append(f"keep has indices outside [0, {n}) (min {int(keep_cpu.min())}, max {int(keep_cpu.max())})")
        if tuple(order.shape) != (n_keep,) or not torch.equal(torch.sort(order.detach().cpu()).values, keep_cpu):
            out.append("order is not the kept indices in pick order (sorted, it must equal keep)")
    if tuple(scores.shape) != (n,) or scores.dtype != torch.float32:
        out.append(f"scores must be ({n},) float32, got {tuple(scores.shape)} {scores.dtype}")
    if sel.tokens is not None and (not isinstance(sel.tokens, torch.Tensor) or sel.tokens.shape[0] != n_keep):
        out.append(f"tokens must have one row per kept index ({n_keep})")
    into = getattr(sel, "merged_into", None)
    if into is not None:
        if not isinstance(into, torch.Tensor) or tuple(into.shape) != (n,) or into.dtype != torch.long:
            out.append(f"merged_into must be ({n},) int64, got {getattr(into, 'shape', type(into).__name__)}")
        elif into.device.type != "meta" and tuple(keep.shape) == (n_keep,):
            t = into.detach().cpu()
            targets = t[t >= 0]
            if (t.numel() and int(t.min()) < -1) or not bool(torch.isin(targets, keep.detach().cpu()).all()):
                out.append("merged_into must hold -1 or a kept index for every token")
    if device is not None:
        off = [nm for nm in ("keep", "order", "scores", "tokens", "pmi", "pivot", "merged_into")
               if isinstance(getattr(sel, nm), torch.Tensor) and getattr(sel, nm).device != torch.device(device)]
        if off:
            out.append(f"{', '.join(off)} {'is' if len(off) == 1 else 'are'} not on the inputs' device ({device})")
    return out


def check_matrix(name: str, x: Any, *, ndim: int = 2) -> None:
    """A float tensor of `ndim` dims with finite values, else ValueError naming `name` (the values are not
    read within `values_checked()` or under torch.compile: checked once at the edge instead)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if not torch.compiler.is_compiling() and not _VALUES_CHECKED.get():
        check_finite(name, x)


# Set by `mipruner.prune` while a method runs on inputs whose values it has checked at the edge: inside,
# `check_matrix` checks types and shapes only, so a selection makes no host sync for its checks and can
# be captured as one graph (`capture.py`). Under torch.compile the value checks are the caller's.
_VALUES_CHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar("mipruner_values_checked", default=False)


@contextlib.contextmanager
def flag_set(var: contextvars.ContextVar, value) -> None:
    """Within: the context variable `var` holds `value` (this thread or task only); restored on exit."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def values_checked():
    """Within: `check_matrix` skips the finiteness check (the caller made it once, at the edge)."""
    return flag_set(_VALUES_CHECKED, True)


# Set by `capture.run_batch` while a method runs under `torch.vmap` (B items as one batched call): there a
# tensor has no storage of its own, so host shortcuts (NumPy's syrk in `gram`) give way to torch ops.
_BATCHED: contextvars.ContextVar[bool] = contextvars.ContextVar("mipruner_batched", default=False)


def batched():
    """Within: the method runs under `torch.vmap` (`capture.run_batch`); `gram` is a plain matmul."""
    return flag_set(_BATCHED, True)


def check_finite(name: str, x: torch.Tensor) -> None:
    """ValueError naming `name` when the float tensor x holds NaN or inf (one host sync, two when it does)."""
    # Fast path: a finite sum implies every element is finite (NaN/inf propagate through +), and
    # a sum is one read pass with no (N, d) bool temporary. Only a non-finite sum, a real NaN/inf
    # or an overflow of large values, pays for the exact element-wise check.
    if not bool(torch.isfinite(x.sum(dtype=torch.float32))) and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf values")


def top_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the k largest entries of the 1-D x, largest first, ties to the LOWEST index on every
    device (a stable descending sort; `torch.topk` leaves ties to the kernel, which differs on CUDA)."""
    return torch.sort(x, descending=True, stable=True).indices[:k]


def check_budget(budget: Any) -> int | float:
    """`budget` as the library takes it before N_V is known: an int >= 1 (tokens) or a float in
    (0, 1] (a share of N_V), returned as a plain int or float; anything else raises ValueError. The
    one budget rule: the edges where a budget comes in (the app's settings, the sweep and lmms-eval
    arguments, `prune` / `select` through `resolve_budget`) apply it, and nothing below them again."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float, np.integer, np.floating)):
        raise ValueError(f"budget must be an int (tokens) or a float in (0, 1] (share), got {budget!r}")
    if isinstance(budget, (float, np.floating)):
        if not 0.0 < float(budget) <= 1.0:  # NaN fails too
            raise ValueError(f"budget as a share must be in (0, 1], got {budget}")
        return float(budget)
    if int(budget) < 1:
        raise ValueError(f"budget in tokens must be >= 1, got {int(budget)}")
    return int(budget)


def resolve_budget(budget: Any, n: int) -> int:
    """Turn `budget` into a token count K in [1, n].

    int: K itself, must lie in [1, n]. float in (0, 1]: share of n, K = floor(share * n + 0.5),
    at least 1. Anything else raises ValueError (`check_budget`); a budget above n raises rather
    than clips.
    """
    b = check_budget(budget)
    if isinstance(b, float):
        return max(1, min(n, int(math.floor(b * n + 0.5))))
    if b > n:
        raise ValueError(f"budget must be in [1, N_V={n}] tokens, got {b}")
    return b


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """`value` when it is one of `choices`; else a ValueError naming the argument and the choices."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """L2-normalised float32 rows; zero rows stay zero (never NaN)."""
    return F.normalize(x.to(torch.float32), dim=-1, eps=1e-12)


def cosine_to(visual: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """cos(v_i, t_j) in float32: (N_V, N_T); zero-norm rows give 0, never NaN.

    Computed as (V @ t~^T) / ||v_i||: V is read twice (matmul, norms) but never copied, which
    matters at N_V x d = 16384 x 4096.
    """
    v = visual.to(torch.float32)
    norms = torch.linalg.vector_norm(v, dim=1).clamp_min(1e-12)  # (N_V,)
    return (v @ unit_rows(text).T) / norms[:, None]  # (N_V, d) @ (d, N_T) -> (N_V, N_T)


def gram(u: torch.Tensor) -> torch.Tensor:
    """u @ u.T for a (N, d) float32 matrix, exploiting symmetry on the CPU.

    On the CPU, NumPy's matmul recognises `a @ a.T` and calls BLAS syrk, which computes one
    triangle (half the flops of gemm) and mirrors it; measured here: 10 ms vs 25 ms for
    576 x 4096. On other devices it is a plain matmul. Result: (N, N) float32, symmetric.
    """
    if u.device.type == "cpu" and u.dtype == torch.float32 and (torch.compiler.is_compiling() or not _BATCHED.get()):
        a = u.contiguous().numpy()
        return torch.from_numpy(a @ a.T)
    return u @ u.T
