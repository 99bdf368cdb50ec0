"""An adapter's declared abilities (`Abilities`) and its decoding state, declared in one object (`Adapter.decode_state`): the decoding path it
answers on (`common/path.py`'s DecodePath, chosen by `choose`: `Adapter.use_decode_path`; read-only
otherwise), the declared bucket set (`Buckets`: the only shapes the compiled path compiles), the compiled
functions, one per (function, shape) (`common/decode.DecodeEngine.compiled`), the static caches
(`DecodeEngine.static_cache`), the shapes the compiled path has run, per function, and how many forwards
ran eagerly because their shape lay outside the declared set."""
from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from .path import PLAIN, DecodePath, round_up


def static_slots(width: int, max_new_tokens: int, bucket: int) -> int:
    """The static cache's slots: the batch's (bucketed) width + new tokens, rounded up to the bucket."""
    return round_up(int(width) + int(max_new_tokens), max(int(bucket), 1))


@dataclass(frozen=True)
class Abilities:
    """What an adapter can do beyond the contract, declared once per class (`Adapter.abilities`), never
    probed. batch_decoding: `generate_batch` answers several (encoding, keep) rows as one batch through
    the decoding engine (and the adapter has the bucketed / compiled decoding paths); batch_encoding:
    `encode_batch` runs several items' vision towers as one call."""

    batch_decoding: bool = False
    batch_encoding: bool = False


@dataclass(frozen=True)
class Buckets:
    """The declared shapes of the compiled path, per compiled function: "prefill" (rows, width), "step"
    (rows, static-cache slots), "tower" (images,). A forward whose shape is not here runs eagerly (as
    vLLM's runner runs a batch it has no captured graph for), so a request never compiles."""

    shapes: Mapping[str, frozenset] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "shapes", {k: frozenset(tuple(int(s) for s in sh) for sh in v)
                                            for k, v in dict(self.shapes).items()})

    def holds(self, name: str, shape: tuple) -> bool:
        return tuple(int(s) for s in shape) in self.shapes.get(name, frozenset())

    @classmethod
    def grid(cls, rows: Iterable[int], widths: Iterable[int], new_tokens: Iterable[int], bucket: int,
             towers: Iterable[int] = (1,)) -> "Buckets":
        """Every prefill (rows, width) and step (rows, slots of width + n new tokens) of the given row
        counts (powers of two), widths (multiples of `bucket`) and answer lengths; the tower's image counts."""
        rows, widths, new_tokens = list(rows), list(widths), list(new_tokens)
        return cls({"prefill": {(r, w) for r in rows for w in widths},
                    "step": {(r, static_slots(w, n, bucket)) for r in rows for w in widths for n in new_tokens},
                    "tower": {(t,) for t in towers}})

    def narrowed(self, seen: Mapping[str, Iterable[tuple]]) -> "Buckets":
        """The declared shapes that `seen` holds too (what a warm-up did compile)."""
        seen = {k: {tuple(s) for s in v} for k, v in seen.items()}
        return Buckets({k: v & seen.get(k, set()) for k, v in self.shapes.items()})

    def __len__(self) -> int:
        return sum(len(v) for v in self.shapes.values())


class DecodeState:
    """path: the DecodePath answers take (read-only; `choose` sets it). buckets: the declared set (None:
    each shape compiles on its first use). compiled: (name, shape) -> (model, compiled function). caches:
    (rows, slots) -> StaticCache, least recently used first. shapes: name -> shapes run compiled.
    eager: name -> forwards run eagerly on the compiled path (their shape was not declared)."""

    def __init__(self):
        self._path: DecodePath = PLAIN  # the plain path (the default) until `choose` picks another
        self.buckets: Buckets | None = None
        self.compiled: dict = {}
        self.caches: OrderedDict = OrderedDict()
        self.shapes: dict = {}
        self.eager: Counter = Counter()

    @property
    def path(self) -> DecodePath:
        return self._path

    def choose(self, *, bucket: int = 0, static_cache: bool = False, compile: bool = False,
               buckets: Buckets | None = None) -> DecodePath:
        """Decode on this path from now on (all zero/False: the plain path), compiling only the shapes
        of `buckets` when given (None: every shape on its first use); returns the path."""
        self._path = DecodePath(bucket=int(bucket), static_cache=bool(static_cache), compile=bool(compile))
        self.buckets = buckets
        return self._path

    def declare(self, buckets: Buckets | None) -> None:
        """Compile only `buckets`' shapes from now on (None: any shape)."""
        self.buckets = buckets

    def allows(self, name: str, shape: tuple) -> bool:
        """Whether a forward of `name` at `shape` may run compiled (declared, or nothing declared)."""
        return self.buckets is None or self.buckets.holds(name, shape)

    def saw(self, what: str, shape: tuple) -> None:
        self.shapes.setdefault(what, set()).add(tuple(int(s) for s in shape))

    def counts(self) -> dict:
        """How many shapes each compiled function has run: {"prefill": n, "step": n}."""
        return {k: len(v) for k, v in sorted(self.shapes.items())}


__all__ = ["Abilities", "Buckets", "DecodeState", "static_slots"]
