"""Selections of B items as one batched call: `prune_batch`, the batched edge of `mipruner.prune`.

    sels = prune_batch("mi", visual=[V0, V1, V2], text=[T0, T1, T2], budget=64)   # = [prune(...) per item]

Items whose tensor inputs have equal shapes (one model's N_V, prompts of one length) and equal host
metadata (pool's grid) form a group. A group of two or more, for a method that declares it allows it
(`capture.Capturable(batch=True)` and its conditions met for these parameters), runs as ONE call:
`torch.vmap` over the method's own function, the inputs stacked on a leading dim, so B selections
are the kernels of one (a few hundred launches for MI's greedy, not B times that); on CUDA that call
is recorded as one CUDA graph per (method, B, K, shapes) and replayed (`capture.run`). Every other
item runs alone, through the same path as `prune`.

Equality with one by one: the decisions (keep, order, and the tokens a merging method keeps) are
the same; the float scores come from batched kernels (a batched matmul instead of B matmuls, and on
the CPU a plain matmul where one item uses NumPy's syrk, `selection.gram`), so they agree within
float32 rounding, not bit for bit (tests/pruners/test_capture.py states the tolerance).

A `cache=` (MI's per-encoding normalisers) is not used on the batched path (the stacked call computes
them for the whole group at once); an item that runs alone uses its own.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from . import capture
from ._registry import INPUTS, MethodSpec, check_plugin_selection, check_tensors, get_pruner, run_pre_llm
from .selection import Selection, batched, check_finite, resolve_budget, values_checked

_FIELDS = tuple(f.name for f in dataclasses.fields(Selection) if f.name not in ("extras", "method"))


def _split_leaves(sel: Selection) -> tuple[dict, dict]:
    """({name: tensor} of `sel`'s tensor fields and extras ("extras.<key>"), the rest of it)."""
    leaves, rest = {}, {"extras": {}}
    for f in _FIELDS:
        v = getattr(sel, f)
        (leaves.__setitem__(f, v) if isinstance(v, torch.Tensor) else rest.__setitem__(f, v))
    for k, v in sel.extras.items():
        (leaves.__setitem__(f"extras.{k}", v) if isinstance(v, torch.Tensor) else rest["extras"].__setitem__(k, v))
    rest["method"] = sel.method
    return leaves, rest


def _join(leaves: dict, rest: dict, index=None) -> Selection:
    """A Selection from tensor leaves (each `[index]`, or whole) and the other fields."""
    pick = (lambda t: t) if index is None else (lambda t: t[index])  # noqa: E731
    fields = {f: pick(leaves[f]) if f in leaves else rest[f] for f in _FIELDS}
    extras = {**rest["extras"], **{k[7:]: pick(v) for k, v in leaves.items() if k.startswith("extras.")}}
    return Selection(**fields, extras=extras, method=rest["method"])


def _stacked(spec: MethodSpec):
    """A function of the method's keywords whose tensor inputs carry a leading batch dim: the method's
    function under `torch.vmap`, returning one Selection whose tensors carry that dim too."""
    static_names = spec.capture.static

    def call(**kw) -> Selection:
        tensors = {n: v for n, v in kw.items() if isinstance(v, torch.Tensor) and n not in static_names}
        other = {n: v for n, v in kw.items() if n not in tensors}
        rest: dict = {}

        def one(t: dict) -> dict:
            leaves, r = _split_leaves(spec.fn(**t, **other))
            rest.update(r)
            return leaves

        with values_checked(), batched():
            leaves = torch.vmap(one, randomness="error")(tensors)
        return _join(leaves, rest)

    return call


def _group_key(item: dict, static_names: tuple) -> tuple:
    return tuple((n, tuple(v.shape), v.dtype, v.device) if n not in static_names else (n, capture.content_key(v))
                 for n, v in sorted(item.items()) if isinstance(v, torch.Tensor))


def run_batch(spec: MethodSpec, items: Sequence[dict], budget, kw: dict) -> list[Selection]:
    """Pre-LLM method `spec` on B items (each {"visual", "text", <inputs>}, `kw` already bound): equal-shape
    groups that the method allows as one call (module doc), the others one by one (`run_pre_llm`)."""
    out: list[Selection | None] = [None] * len(items)
    groups: dict[tuple, list[int]] = {}
    rule = None if kw.get("per_frame", "off") != "off" else spec.capture  # per frame: one item at a time
    kw_fn = {n: v for n, v in kw.items() if n != "per_frame"}  # the registry's option, never the function's
    for i, item in enumerate(items):
        n_v = item["visual"].shape[0] if isinstance(item.get("visual"), torch.Tensor) else 0
        if rule is not None and rule.batch and n_v and capture.capturable(spec, n_v, kw_fn):
            groups.setdefault(_group_key(item, rule.static), []).append(i)
    stacked_ids = {i for g in groups.values() if len(g) > 1 for i in g}
    for i in (i for i in range(len(items)) if i not in stacked_ids):  # alone: the path of `prune`
        item = items[i]
        inputs = {n: v for n, v in item.items() if n not in ("visual", "text")}
        out[i] = run_pre_llm(spec, item["visual"], item.get("text"), budget, inputs, kw)
    for idx in (g for g in groups.values() if len(g) > 1):
        first = items[idx[0]]
        with values_checked():  # shapes and types per item; the values below, once for the group
            for i in idx:
                check_tensors(spec, items[i]["visual"], items[i].get("text"))
        k = resolve_budget(budget, first["visual"].shape[0])
        stacked = {n: (torch.stack([items[i][n] for i in idx]) if isinstance(v, torch.Tensor)
                       and n not in rule.static else v) for n, v in first.items() if n != "cache"}
        for n in ("visual", "text"):
            if isinstance(stacked.get(n), torch.Tensor):
                check_finite(n, stacked[n])
        sel = capture.run(spec, k, stacked, kw_fn, fn=_stacked(spec), label=f"batch{len(idx)}:")
        leaves, rest = _split_leaves(sel)
        for j, i in enumerate(idx):
            one = _join(leaves, rest, j)
            if spec.checked:
                check_plugin_selection(spec, one, first["visual"].shape[0], k, first["visual"].device)
            one.method = spec.name
            out[i] = one
    return out  # type: ignore[return-value]


def prune_batch(name: str, *, visual: Sequence[torch.Tensor], text: Sequence[torch.Tensor] | None = None,
                budget: int | float, **params) -> list[Selection]:
    """`[mipruner.prune(name, visual=visual[i], text=text[i], budget=budget, ...) for i in range(B)]`, with
    equal-shape items run as one batched call where the method allows it (module doc). Tensor inputs
    (`attention`, `keys`, `grid`, ...) are per-item sequences of length B like `visual`; method parameters
    are shared. Decisions equal the one-by-one ones; scores agree within float32 rounding."""
    spec = get_pruner(name)
    if spec.stage == "llm":
        raise ValueError(f"{name!r} selects inside the LLM: use mipruner.select(adapter, encoded, {name!r}, budget)")
    b = len(visual)
    inputs = {k: v for k, v in params.items() if k in INPUTS}
    bad = sorted(k for k in inputs if k not in spec.accepts)
    if bad:
        raise TypeError(f"prune_batch({name!r}) got unknown keyword argument(s) {bad}; "
                        f"{name!r} accepts {sorted((*spec.accepts, *spec.param_names))}")
    for k, v in {"text": text, **inputs}.items():
        if v is not None and len(v) != b:
            raise ValueError(f"{k} has {len(v)} items for {b} visual inputs: pass one per item")
    kw = spec.bind({k: v for k, v in params.items() if k not in INPUTS})
    items = [{"visual": visual[i], "text": None if text is None else text[i],
              **{k: v[i] for k, v in inputs.items() if v is not None}} for i in range(b)]
    return run_batch(spec, items, budget, kw)


__all__ = ["prune_batch", "run_batch"]
