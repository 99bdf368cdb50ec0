"""The pruner registry: a dict filled by a decorator (timm's `_registry.py` pattern).

Adding a method is one decorated function in one file. `prune(name, ...)` is the front door: it
resolves the name (with a "did you mean" on typos), checks the keyword arguments against the
function's signature, resolves the budget and validates the tensors before calling the method.
"""
from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from .selection import Selection, check_matrix, resolve_budget

_REGISTRY: dict[str, "PrunerSpec"] = {}


@dataclass(frozen=True)
class PrunerSpec:
    name: str
    fn: Callable[..., Selection]
    needs_text: bool  # text-conditioned: `text` must be a non-empty (N_T, d) tensor
    needs_attention: bool  # needs vision-encoder attention (and maybe keys)
    is_mi: bool  # returns PMI matrices and pivot words
    summary: str

    @property
    def params(self) -> dict[str, inspect.Parameter]:
        """Method-specific keyword parameters (beyond visual/text/budget) with their defaults."""
        sig = inspect.signature(self.fn)
        return {k: p for k, p in sig.parameters.items() if k not in ("visual", "text", "budget")}


def register_pruner(name: str, *, needs_text: bool = False, needs_attention: bool = False,
                    is_mi: bool = False):
    """Decorator: `@register_pruner("mi", needs_text=True, is_mi=True)` over `fn(visual, text, budget, **params)`."""

    def deco(fn: Callable[..., Selection]) -> Callable[..., Selection]:
        if name in _REGISTRY:
            raise ValueError(f"pruner {name!r} is registered twice")
        doc = (inspect.getdoc(fn) or "").strip().splitlines()
        _REGISTRY[name] = PrunerSpec(name, fn, needs_text, needs_attention, is_mi, doc[0] if doc else "")
        return fn

    return deco


def list_pruners() -> list[str]:
    """Names of all registered pruners, sorted."""
    return sorted(_REGISTRY)


def get_pruner(name: str) -> PrunerSpec:
    """The registry entry for `name`; unknown names raise ValueError with the known names."""
    if not isinstance(name, str) or name not in _REGISTRY:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"Unknown pruner ({name!r}).{hint} Known pruners: {', '.join(list_pruners())}")
    return _REGISTRY[name]


def prune(name: str, *, visual: torch.Tensor, text: torch.Tensor | None = None,
          budget: int | float, **params) -> Selection:
    """Select `budget` visual tokens with pruner `name`.

    visual: (N_V, d) projected visual tokens; text: (N_T, d) prompt embeddings (text-conditioned
    methods); budget: int in [1, N_V] (tokens) or float in (0, 1] (share of N_V, rounded half up,
    at least 1). A budget above N_V raises: we never clip silently. Method parameters
    (`lam`, `tau`, `attention`, `seed`, ...) are keyword-only; unknown ones raise TypeError.
    """
    spec = get_pruner(name)
    allowed = spec.params
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise TypeError(f"prune({name!r}) got unknown keyword argument(s) {unknown}; "
                        f"{name!r} accepts {sorted(allowed)}")
    check_matrix("visual", visual)
    n_v = visual.shape[0]
    if n_v == 0:
        raise ValueError("visual has no tokens (N_V = 0)")
    if spec.needs_text:
        if text is None:
            raise ValueError(f"{name!r} is text-conditioned: pass text=(N_T, d) prompt embeddings")
        check_matrix("text", text)
        if text.shape[0] == 0:
            raise ValueError(f"text is empty (N_T = 0); {name!r} needs at least one text token")
        if text.shape[1] != visual.shape[1]:
            raise ValueError(f"width mismatch: visual has d={visual.shape[1]}, text has d={text.shape[1]}; "
                             "both must live in the LLM's input space")
    k = resolve_budget(budget, n_v)
    sel = spec.fn(visual=visual, text=text, budget=k, **params)
    sel.method = name
    return sel
