"""The answer cache of one encoding: what decides an answer, as a key.

An answer depends on the method, the budget in tokens (a share and its token count are one entry),
the parameters that method accepts (a shared dict of settings carries others, which change nothing)
and max_new_tokens; `None` as the method is the unpruned reference. The engine keeps the answers
of each cached encoding in its `CachedEncoding.answers` under these keys, so they go with it.
"""
from __future__ import annotations

from ..pruners import get_pruner, resolve_budget


def _frozen(params: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def answer_key(n_visual: int, method: str | None, budget, params: dict | None, max_new_tokens: int) -> tuple:
    """The key of method `method`'s answer at `budget` on an encoding of `n_visual` visual tokens."""
    if method is None:
        return (None, None, (), max_new_tokens)
    accepted = get_pruner(method).param_names
    k = resolve_budget(budget, n_visual)
    used = {p: v for p, v in (params or {}).items() if p in accepted and p != "cache"}
    return (method, k, _frozen(used), max_new_tokens)


__all__ = ["answer_key"]
