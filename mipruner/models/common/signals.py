"""The encoder signals a `Signals` request asks for, recorded in the tower pass that makes the visual tokens:
`Record` holds removable forward hooks on every asked block (and a pre-hook on the projector for the
pre-projector features) and turns what they saw into the `Encoded` fields (`blocks`, `attention`,
`keys`, `features`). Each family says how its blocks are reached (`modules`) and how one block's
per-view maps become the pruners' form over the N_V visual tokens (`to_tokens`); that map is linear,
so the per-head maps go through the same function head by head and their mean is the head-mean form.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Callable

import torch

from ...pruners.signals import Signals, resolve_block


def plan(want: Signals, depth: int, default: int, actual: Callable[[int], int] = lambda b: b):
    """({block asked, in [0, depth): block that gives it}, blocks recorded per head). Any block asked also
    records `default` (the adapter's block of `Encoded.attention`); ValueError for a block the tower lacks."""
    if not want.attention:
        return {}, set()
    res = {None: default}
    for layer in want.layers - {None}:
        res[layer] = resolve_block(layer, depth)
    asked = {b: actual(b) for b in res.values()}
    return asked, {asked[res[layer]] for layer in want.heads}


@contextlib.contextmanager
def projector_input(module, enabled: bool):
    """A list filled with every input `module` (the projector) is called on during the block, detached;
    the hook is removed on exit."""
    seen: list[torch.Tensor] = []
    if not enabled:
        yield seen
        return

    def pre(_module, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()))
        seen.append(x.detach())

    handle = module.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


class Record:
    """The hooks of one `Signals` request on one tower pass (a context manager).

    modules(block) -> the hooks' context for that block, yielding a dict filled during the forward with
    "attention" (B, n, n) head mean, "keys" (B, n, d_head) and, asked per head, "heads" (B, H, n, n)
    (`clip_attention.capture_block`). projector: the module whose input is the pre-projector features.
    """

    def __init__(self, want: Signals, depth: int, default: int, modules: Callable, projector=None,
                 actual: Callable[[int], int] = lambda b: b):
        self.want, self.depth, self.default = want, depth, default
        self.asked, self.heads = plan(want, depth, default, actual)
        self._modules, self._projector = modules, projector
        self.caps: dict[int, dict] = {}
        self.inputs: list[torch.Tensor] = []

    def __enter__(self) -> "Record":
        self._stack = contextlib.ExitStack()
        with contextlib.ExitStack() as stack:
            for b in sorted(set(self.asked.values())):
                self.caps[b] = stack.enter_context(self._modules(b, b in self.heads))
            if self._projector is not None:
                self.inputs = stack.enter_context(projector_input(self._projector, self.want.features))
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    @property
    def cap(self) -> dict | None:
        """The default block's raw capture (None when no attention was asked)."""
        return self.caps.get(self.asked.get(self.default)) if self.asked else None

    def item(self, j: int) -> "Record":
        """Item j's share of a batched pass (one image per item)."""
        out = copy.copy(self)
        out.caps = {b: {k: v[j:j + 1] for k, v in c.items()} for b, c in self.caps.items()}
        out.inputs = [x[j:j + 1] for x in self.inputs]
        return out

    def finish(self, out: dict, to_tokens: Callable) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill `out` (the family's `_encode_visual` result) with "blocks", "depth", "block"; returns the
        default block's (attention, keys). to_tokens(attention (B, n, n), keys (B, n, d)) -> the pruners' form."""
        per = {}
        for b, c in self.caps.items():
            att, keys = to_tokens(c["attention"], c["keys"])
            per[b] = {"attention": att, "keys": keys, "block": b}
            if "heads" in c:
                h = c["heads"]  # (B, H, n, n)
                per[b]["attention_heads"] = torch.stack([to_tokens(h[:, i], c["keys"])[0] for i in range(h.shape[1])])
        out.update(blocks={a: per[b] for a, b in self.asked.items()}, depth=self.depth, block=self.default)
        first = per[self.asked[self.default]]
        return first["attention"], first["keys"]

    def features(self) -> torch.Tensor | None:
        """The projector's inputs, (calls * B, n, d_vision) concatenated along the first axis; None if not asked."""
        if not self.want.features:
            return None
        if not self.inputs:
            raise RuntimeError("the projector was never called: no pre-projector features to record")
        return torch.cat(self.inputs, dim=0)


def encoded_fields(out: dict, want: Signals) -> dict:
    """The `Encoded` keyword arguments for the signals in a family's `_encode_visual` result."""
    return dict(features=out.get("features"), blocks=out.get("blocks", {}), signals=want,
                encoder_depth=out.get("depth", 0), encoder_block=out.get("block"))


__all__ = ["Record", "encoded_fields", "plan", "projector_input"]
