"""An adapter's decoding state, declared in one object (`Adapter.decode_state`): the decoding path it
answers on (`common/path.py`'s DecodePath, chosen by `choose`: `Adapter.use_decode_path`), the compiled
prefill, step and tower (`common/greedy.compiled`), the static caches (`common/greedy.static_cache`) and the
shapes the compiled path has run, per function (a bounded set: the warm-up's fixed buckets)."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from .path import PLAIN, DecodePath


@dataclass
class DecodeState:
    path: DecodePath = PLAIN  # the plain path (the default) until `choose` picks another
    compiled: dict = field(default_factory=dict)  # name -> (model, compiled function)
    caches: OrderedDict = field(default_factory=OrderedDict)  # (rows, slots) -> StaticCache, least recent first
    shapes: dict = field(default_factory=dict)  # "prefill" / "step" -> set of (rows, width or slots)

    def choose(self, *, bucket: int = 0, static_cache: bool = False, compile: bool = False) -> DecodePath:
        """Decode on this path from now on (all zero/False: the plain path); returns it."""
        self.path = DecodePath(bucket=int(bucket), static_cache=bool(static_cache), compile=bool(compile))
        return self.path

    def saw(self, what: str, shape: tuple[int, int]) -> None:
        self.shapes.setdefault(what, set()).add(tuple(int(s) for s in shape))

    def counts(self) -> dict:
        """How many shapes each compiled function has run: {"prefill": n, "step": n}."""
        return {k: len(v) for k, v in sorted(self.shapes.items())}


__all__ = ["DecodeState"]
