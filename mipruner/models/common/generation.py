"""One declared generation config (`GenerationConfig`), in the spirit of transformers' `GenerationConfig`:
what an answer asks of the decoder, validated once where a request enters (`GenerationConfig.of`, called
by `mipruner.answer`, `mipruner.answer_batch`, `Adapter.generate` / `generate_batch`) and passed down as
an object. Nothing below the edge checks `max_new_tokens` again or pops keyword arguments.

    cfg = GenerationConfig(max_new_tokens=32)            # or GenerationConfig.of(32, min_new_tokens=32)
    mipruner.answer(adapter, enc, sel, config=cfg)       # the same as max_new_tokens=32

Fields (greedy decoding only, as `generate(do_sample=False)`): `max_new_tokens` (>= 1), `min_new_tokens`
(EOS masked before that many, in [0, max_new_tokens]), `eos_token_id` (None: the model's generation
config; () never stops), `pad_token_id` (what a finished row is fed; None: the tokenizer's, else the
first EOS, else 0), `logits_processor` (callables (generated (B, t), scores (B, V)) -> scores, applied
before the argmax), `extra` (other `transformers.GenerationMixin.generate` arguments: only the LLaVA
family's adapters accept them, and then answer through `generate` itself; the Qwen family refuses them).
`resolve(...)` fills the defaults from a model, once per answer, so the engine reads concrete values.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

FIELDS = ("max_new_tokens", "min_new_tokens", "eos_token_id", "pad_token_id", "logits_processor")


def _count(name: str, value, lo: int) -> int:
    """`value` as an int >= `lo` (a bool, a fraction, NaN or infinity raises ValueError)."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}") from None
    if not math.isfinite(f):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if f != int(f):
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    if int(f) < lo:
        raise ValueError(f"{name} must be >= {lo}, got {int(f)}")
    return int(f)


@dataclass(frozen=True)
class GenerationConfig:
    """What one answer asks of the decoder (module docstring). Immutable and checked when built."""

    max_new_tokens: int = 64
    min_new_tokens: int = 0
    eos_token_id: tuple[int, ...] | None = None
    pad_token_id: int | None = None
    logits_processor: tuple = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        put = object.__setattr__  # frozen: normalise once, here
        put(self, "max_new_tokens", _count("max_new_tokens", self.max_new_tokens, 1))
        put(self, "min_new_tokens", _count("min_new_tokens", self.min_new_tokens or 0, 0))
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) must be <= max_new_tokens "
                             f"({self.max_new_tokens})")
        eos = self.eos_token_id
        if eos is not None:
            put(self, "eos_token_id", (_count("eos_token_id", eos, 0),) if isinstance(eos, int) and not isinstance(
                eos, bool) else tuple(_count("eos_token_id", e, 0) for e in eos))
        if self.pad_token_id is not None:
            put(self, "pad_token_id", _count("pad_token_id", self.pad_token_id, 0))
        procs = tuple(self.logits_processor or ())
        if not all(callable(p) for p in procs):
            raise ValueError("logits_processor must hold callables (generated ids, scores) -> scores")
        put(self, "logits_processor", procs)
        extra = dict(self.extra or {})
        if extra.get("do_sample"):
            raise ValueError("only greedy decoding is supported (do_sample=False)")
        extra.pop("do_sample", None)
        put(self, "extra", MappingProxyType(extra))

    @classmethod
    def of(cls, max_new_tokens=None, config: "GenerationConfig | None" = None, **gen) -> "GenerationConfig":
        """The edge: `config` as it is, or one built from `max_new_tokens` (None: 64) and `gen` (the
        fields above; any other keyword goes to `extra`). ValueError on both, or on a bad value."""
        if config is not None:
            if not isinstance(config, GenerationConfig):
                raise ValueError(f"config must be a GenerationConfig, got {type(config).__name__}")
            if gen or (max_new_tokens is not None and int(max_new_tokens) != config.max_new_tokens):
                raise ValueError("pass either a GenerationConfig (config=) or generation keywords, not both")
            return config
        known = {k: gen.pop(k) for k in FIELDS[1:] if k in gen}
        return cls(max_new_tokens=64 if max_new_tokens is None else max_new_tokens, extra=gen, **known)

    def resolve(self, model, pad_token_id: int | None = None) -> "GenerationConfig":
        """This config with its defaults filled from `model` (its generation config's EOS) and
        `pad_token_id` (the tokenizer's pad token): a concrete `eos_token_id` tuple and `pad_token_id`."""
        eos = self.eos_token_id
        if eos is None:
            eos = model.generation_config.eos_token_id
            eos = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
        pad = self.pad_token_id if self.pad_token_id is not None else pad_token_id
        if pad is None:
            pad = eos[0] if eos else 0
        return dataclasses.replace(self, eos_token_id=tuple(eos), pad_token_id=pad, extra=dict(self.extra))

    @property
    def eos(self) -> list[int]:
        """The EOS ids (after `resolve`)."""
        return list(self.eos_token_id or ())

    def generate_kwargs(self) -> dict:
        """The keyword arguments of `transformers` `generate` for this config (greedy)."""
        kw: dict = dict(self.extra, max_new_tokens=self.max_new_tokens, do_sample=False)
        if self.min_new_tokens:
            kw["min_new_tokens"] = self.min_new_tokens
        if self.eos_token_id is not None:
            kw["eos_token_id"] = list(self.eos_token_id)
        if self.pad_token_id is not None:
            kw["pad_token_id"] = self.pad_token_id
        return kw

    def answer_kwargs(self) -> dict:
        """`max_new_tokens` (and `min_new_tokens` when set): what an in-LLM method's `answer` takes."""
        return {"max_new_tokens": self.max_new_tokens, **({"min_new_tokens": self.min_new_tokens}
                                                            if self.min_new_tokens else {})}


__all__ = ["FIELDS", "GenerationConfig"]
