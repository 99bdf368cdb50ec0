"""One declared generation config (`GenerationConfig`), in the spirit of transformers' `GenerationConfig`:
what an answer asks of the decoder, validated once where a request enters (`GenerationConfig.of`, called
by `mipruner.answer`, `mipruner.answer_batch`, `Adapter.generate` / `generate_batch`) and passed down as
an object. Nothing below the edge checks `max_new_tokens` again or pops keyword arguments.

    cfg = GenerationConfig(max_new_tokens=32)            # or GenerationConfig.of(32, min_new_tokens=32)
    mipruner.answer(adapter, enc, sel, config=cfg)       # the same as max_new_tokens=32
    mipruner.answer(adapter, enc, sel, config=cfg, logits_processor=[watch])   # a callable travels beside it

Fields (greedy decoding only, as `generate(do_sample=False)`): `max_new_tokens` (>= 1), `min_new_tokens`
(EOS masked before that many, in [0, max_new_tokens]), `eos_token_id` (None: the model's generation
config; () never stops), `pad_token_id` (what a finished row is fed; None: the tokenizer's, else the
first EOS, else 0), `extra` (other `transformers.GenerationMixin.generate` arguments: only the LLaVA
family's adapters accept them, and then answer through `generate` itself; the Qwen family refuses them).
`resolve(...)` fills the defaults from a model, once per answer, so the engine reads concrete values.

A config holds values only, so it hashes, compares and serialises (`to_dict` / `from_dict`, JSON-safe when its
`extra` is): numbers, strings, booleans, None, and lists / tuples / dicts of them. Callables travel beside it,
as transformers keeps `logits_processor=` beside `generation_config=`: every door that takes a config takes
`logits_processor=` (callables (generated (B, t), scores (B, V)) -> scores, applied after the EOS mask and
before the argmax) as its own argument, and passes it down next to the config. A callable (or any other
object) given inside a config raises TypeError saying so.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

FIELDS = ("max_new_tokens", "min_new_tokens", "eos_token_id", "pad_token_id", "extra")
BESIDE = ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "streamer", "assistant_model",
          "negative_prompt_attention_mask")  # generate's non-value arguments: never inside a config
_SCALARS = (type(None), bool, int, float, str)


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


def _beside(name: str, value) -> TypeError:
    """The sentence for a callable or an object given inside a config."""
    if callable(value):
        what = "a callable"
    elif isinstance(value, (list, tuple)) and any(callable(v) for v in value):
        what = "a list of callables"
    else:
        what = f"a {type(value).__name__}, not plain data"
    other = "" if name == "logits_processor" else " (the one callable mipruner's doors take; stopping criteria and " \
        "streamers have none)"
    return TypeError(f"GenerationConfig holds values only (it hashes and serialises), but {name} is {what}: "
                     "callables travel beside a config, as transformers' generate takes logits_processor= beside "
                     "generation_config=, so pass logits processors to the call itself as "
                     f"logits_processor=[...]{other}")


def _plain(name: str, value):
    """`value` as plain data (lists for sequences, dicts with scalar or tuple keys), else TypeError (`_beside`)."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(name, v) for v in value]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not (isinstance(k, _SCALARS) or (isinstance(k, tuple) and all(isinstance(x, _SCALARS) for x in k))):
                raise _beside(f"{name}[{k!r}]", k)
            out[k] = _plain(f"{name}[{k!r}]", v)
        return out
    raise _beside(name, value)


def _frozen(value):
    """A hashable copy of plain data (`_plain`'s): lists as tuples, dicts as their sorted items."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return ("{}", tuple(sorted(((k, _frozen(v)) for k, v in value.items()), key=repr)))
    return value


def processors(logits_processor) -> tuple:
    """`logits_processor=` as the doors take it beside a config (None, or an iterable of callables) as a tuple;
    ValueError when an entry is not callable."""
    procs = tuple(logits_processor or ())
    if not all(callable(p) for p in procs):
        raise ValueError("logits_processor must hold callables (generated ids, scores) -> scores")
    return procs


@dataclass(frozen=True, init=False)
class GenerationConfig:
    """What one answer asks of the decoder (module docstring). Immutable, hashable and checked when built."""

    max_new_tokens: int = 64
    min_new_tokens: int = 0
    eos_token_id: tuple[int, ...] | None = None
    pad_token_id: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __init__(self, max_new_tokens=64, min_new_tokens=0, eos_token_id=None, pad_token_id=None, extra=None,
                 **other):
        for name, value in {**other, **dict(extra or {})}.items():
            if name in BESIDE or callable(value):
                raise _beside(name, value)
        if other:
            raise TypeError(f"GenerationConfig got unknown field(s) {sorted(other)}; its fields are {list(FIELDS)} "
                            "(other generate arguments go in extra=, or through GenerationConfig.of)")
        put = object.__setattr__  # frozen: normalise once, here
        put(self, "max_new_tokens", _count("max_new_tokens", max_new_tokens, 1))
        put(self, "min_new_tokens", _count("min_new_tokens", min_new_tokens or 0, 0))
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) must be <= max_new_tokens "
                             f"({self.max_new_tokens})")
        eos = eos_token_id
        if eos is not None:
            eos = (_count("eos_token_id", eos, 0),) if isinstance(eos, int) and not isinstance(eos, bool) else \
                tuple(_count("eos_token_id", e, 0) for e in eos)
        put(self, "eos_token_id", eos)
        put(self, "pad_token_id", None if pad_token_id is None else _count("pad_token_id", pad_token_id, 0))
        extra = {k: _plain(k, v) for k, v in dict(extra or {}).items()}
        if extra.get("do_sample"):
            raise ValueError("only greedy decoding is supported (do_sample=False)")
        extra.pop("do_sample", None)
        put(self, "extra", MappingProxyType(extra))

    def __hash__(self) -> int:
        return hash((self.max_new_tokens, self.min_new_tokens, self.eos_token_id, self.pad_token_id,
                     _frozen(dict(self.extra))))

    def to_dict(self) -> dict:
        """Its fields as plain data (`eos_token_id` a list or None, `extra` a dict): `from_dict` gives it back."""
        return {"max_new_tokens": self.max_new_tokens, "min_new_tokens": self.min_new_tokens,
                "eos_token_id": None if self.eos_token_id is None else list(self.eos_token_id),
                "pad_token_id": self.pad_token_id, "extra": _plain("extra", dict(self.extra))}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GenerationConfig":
        """The config `to_dict` wrote (a JSON round trip too); an unknown key raises TypeError."""
        return cls(**dict(data))

    @classmethod
    def of(cls, max_new_tokens=None, config: "GenerationConfig | None" = None, **gen) -> "GenerationConfig":
        """The edge: `config` as it is, or one built from `max_new_tokens` (None: 64) and `gen` (the
        fields above; any other keyword goes to `extra`). ValueError on both, or on a bad value; TypeError on a
        callable (`logits_processor` travels beside the config: `processors`)."""
        if config is not None:
            if not isinstance(config, GenerationConfig):
                raise ValueError(f"config must be a GenerationConfig, got {type(config).__name__}")
            if gen or (max_new_tokens is not None and int(max_new_tokens) != config.max_new_tokens):
                raise ValueError("pass either a GenerationConfig (config=) or generation keywords, not both")
            return config
        known = {k: gen.pop(k) for k in FIELDS[1:-1] if k in gen}
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


__all__ = ["BESIDE", "FIELDS", "GenerationConfig", "processors"]
