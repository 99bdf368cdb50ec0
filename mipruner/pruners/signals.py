"""What an encoding records of the vision encoder besides the visual tokens, on request: `Signals`.

A method asks for a signal by naming it in `needs=` or by taking its keyword (`register_pruner`):
`attention` / `keys` (one vision-encoder block's head-mean attention and keys), `attention_heads`
(the same block's per-head attention) and `features` (the tower's hidden states that the projector
reads). Which block: the method's `encoder_layer` (None: the adapter's default block, the one
`Encoded.attention` holds). `mipruner.signals_for(methods)` is the union over a list of methods, and
`adapter.encode(..., signals=...)` records all of it in ONE tower pass (docs/plugins.md).

Blocks count as Python indexes: 0 .. depth-1 from the input, -1 the last block, -2 the penultimate
(for negative numbers that is how `vision_feature_layer` counts too). depth is read from the model.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

SIGNAL_INPUTS = ("attention", "keys", "attention_heads", "features")  # the encoder's inputs a method can ask for


def check_layer(layer) -> int | None:
    """`layer` as an encoder block (None or an int), or ValueError naming it."""
    if layer is None:
        return None
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        raise ValueError(f"encoder_layer must be an int block index (negative: from the end) or None, got {layer!r}")
    return int(layer)


def resolve_block(layer: int, depth: int) -> int:
    """Block `layer` (negative: from the end) as an index in [0, depth), or ValueError in one sentence."""
    if not -depth <= layer < depth:
        raise ValueError(f"encoder block {layer} does not exist: this model's vision encoder has {depth} blocks "
                         f"(0..{depth - 1}, or -{depth}..-1 from the end)")
    return layer % depth


@dataclass(frozen=True)
class Signals:
    """A request (or a record) of encoder signals.

    layers: blocks whose head-mean attention and keys are recorded (`encoder_layer` values; None = the
        adapter's default block); any block at all also records the default block (`Encoded.attention`).
    heads: the blocks of `layers` whose per-head attention is recorded too (memory: H maps).
    features: the pre-projector features, (N_V, d_vision).
    """

    layers: frozenset = frozenset()
    heads: frozenset = frozenset()
    features: bool = False

    def __post_init__(self):
        layers = frozenset(check_layer(x) for x in self.layers)
        heads = frozenset(check_layer(x) for x in self.heads)
        object.__setattr__(self, "layers", layers | heads)
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "features", bool(self.features))

    @classmethod
    def of(cls, need_attention: bool = False, signals: "Signals | None" = None) -> "Signals":
        """What `adapter.encode(need_attention=..., signals=...)` records: the union of both."""
        base = cls(layers=frozenset({None})) if need_attention else cls()
        return base if signals is None else base | signals

    @property
    def attention(self) -> bool:
        """Whether any block's attention is recorded (then the default block's is too)."""
        return bool(self.layers)

    @property
    def extra(self) -> bool:
        """Whether it asks for more than the default block's attention (what `need_attention` gives)."""
        return self.features or bool(self.heads) or bool(self.layers - {None})

    def __or__(self, other: "Signals") -> "Signals":
        return Signals(self.layers | other.layers, self.heads | other.heads, self.features or other.features)

    def covers(self, other: "Signals") -> bool:
        """Whether an encoding that recorded `self` has everything `other` asks for."""
        return other.layers <= self.layers and other.heads <= self.heads and (self.features or not other.features)


def recorded(encoded) -> Signals:
    """The signals an encoding holds: what it says it recorded, and its default block's attention when it has
    one (encodings from adapters written before signals existed)."""
    have = getattr(encoded, "signals", None) or Signals()
    return have | Signals.of(getattr(encoded, "attention", None) is not None)


def encode_kwargs(signals: Signals, views: str = "all") -> dict:
    """`adapter.encode` keyword arguments for `signals`: `need_attention`, and `signals` only when it asks for
    more (so adapters written before signals existed keep working for the methods they serve); `views` only
    when not "all" (`models.common.views.check_views`)."""
    kw = {"need_attention": signals.attention}
    if signals.extra:
        kw["signals"] = signals
    if views != "all":
        kw["views"] = views
    return kw


__all__ = ["SIGNAL_INPUTS", "Signals", "check_layer", "encode_kwargs", "recorded", "resolve_block"]
