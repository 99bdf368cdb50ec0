"""One item, one method: select the visual tokens and answer. Plus the method settings' checks.

`answer(adapter, media, prompt, config)` is the whole "select + answer" path of the lmms-eval
model, in one place: it calls exactly what `python -m mipruner.eval` calls for one item and one
(method, budget) — `adapter.encode`, then `mipruner.prune` with `mipruner.eval.runner.prune_kwargs`
and `adapter.generate` for the pruners of the registry, or `mipruner.inllm.select` /
`inllm.generate` for the methods that prune inside the LLM (FastV, DART) — so both give the same
answers on the same items. When the registry serves every method through one call, this function
becomes that call.

`MethodConfig.parse(...)` turns the `--model_args` of lmms-eval (already converted to int / float
/ bool / str by lmms-eval) into a checked configuration, with plain errors.
"""
from __future__ import annotations

import inspect
import json
import numbers
from dataclasses import dataclass, field

import mipruner
from mipruner import inllm
from mipruner.eval.runner import prune_kwargs
from mipruner.models.text import TEXT_MODES
from mipruner.pruners import get_pruner, list_pruners

# Parameters the eval runner fills in from the encoding itself; never user settings.
_INJECTED = ("attention", "keys", "cache")
NONE = "none"  # answer on every visual token (the unpruned baseline)


def method_names() -> list[str]:
    return [NONE] + list_pruners() + list(inllm.METHODS)


def _method_params(method: str) -> dict:
    """name -> default of the settings `method` accepts."""
    if method == NONE:
        return {}
    if inllm.is_in_llm(method):
        return inllm.defaults(method)
    return {k: p.default for k, p in get_pruner(method).params.items()
            if k not in _INJECTED and p.default is not inspect.Parameter.empty}


def parse_budget(value) -> int | float:
    """An int >= 1 (tokens), a float in (0, 1] (share of the visual tokens) or "25%" (a share)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text[:-1]) / 100 if text.endswith("%") else (float(text) if "." in text else int(text))
        except ValueError:
            raise ValueError(f"budget must be a token count (64), a share (0.25) or a percentage (25%), "
                             f"got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"budget must be a token count (64), a share (0.25) or a percentage (25%), got {value!r}")
    if isinstance(value, numbers.Integral):
        if value < 1:
            raise ValueError(f"a budget in tokens must be >= 1, got {value}")
        return int(value)
    if not 0 < value <= 1:
        raise ValueError(f"a budget given as a share must be in (0, 1], got {value}")
    return float(value)


@dataclass(frozen=True)
class MethodConfig:
    """What one lmms-eval run evaluates: method, budget, its settings and the scored prompt tokens."""

    method: str = NONE
    budget: int | float | None = None
    params: dict = field(default_factory=dict, hash=False)
    text_mode: str = "question"

    @classmethod
    def parse(cls, method: str = NONE, budget=None, text_mode: str = "question", **params) -> "MethodConfig":
        if not isinstance(method, str) or method not in method_names():
            import difflib

            close = difflib.get_close_matches(str(method), method_names(), n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ValueError(f"unknown method {method!r}.{hint} Known: {', '.join(method_names())}")
        if text_mode not in TEXT_MODES:
            raise ValueError(f"text_mode must be one of {', '.join(TEXT_MODES)}, got {text_mode!r}")
        accepted = _method_params(method)
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            known = ", ".join(sorted(accepted)) or "none"
            raise ValueError(f"method {method!r} has no setting(s) {', '.join(unknown)}; its settings: {known}")
        clean = {}
        for k, v in params.items():
            default = accepted[k]
            if isinstance(default, float) and isinstance(v, numbers.Integral) and not isinstance(v, bool):
                v = float(v)  # lam=1 on the command line is the float 1.0
            if default is not None and not isinstance(v, type(default)) and not (
                    isinstance(default, numbers.Real) and isinstance(v, numbers.Real) and not isinstance(v, bool)):
                raise ValueError(f"{method}: {k} must be a {type(default).__name__} (default {default!r}), got {v!r}")
            clean[k] = v
        if method == NONE:
            if budget is not None:
                raise ValueError("method=none keeps every visual token: drop budget=")
            return cls(NONE, None, {}, text_mode)
        if budget is None:
            raise ValueError(f"method {method!r} needs a budget: budget=64 (tokens), budget=0.25 or budget=25%")
        return cls(method, parse_budget(budget), clean, text_mode)

    @property
    def needs_attention(self) -> bool:
        return self.method != NONE and not inllm.is_in_llm(self.method) and get_pruner(self.method).needs_attention

    def key(self) -> str:
        """A stable string naming this configuration (for the answer cache)."""
        return json.dumps({"method": self.method, "budget": self.budget, "params": self.params,
                           "text_mode": self.text_mode}, sort_keys=True, default=str)


def answer(adapter, media, prompt: str, config: MethodConfig, max_new_tokens: int):
    """Encode `media` + `prompt`, keep the visual tokens `config` selects, answer greedily (an Answer)."""
    enc = adapter.encode(media, prompt, text_mode=config.text_mode, need_attention=config.needs_attention)
    return answer_encoded(adapter, enc, config, max_new_tokens)


def answer_encoded(adapter, enc, config: MethodConfig, max_new_tokens: int, cache: dict | None = None):
    """The answer of `config` on an encoding. `cache`: one dict per encoding, shared by the methods and
    budgets answered on it (MI's PMI matrices, FastV/DART's first K layers), as in the eval runner."""
    m = config.method
    if m == NONE:
        return adapter.generate(enc, keep=None, max_new_tokens=max_new_tokens)
    cache = {} if cache is None else cache
    if inllm.is_in_llm(m):
        c = cache.setdefault("inllm", {})
        sel = inllm.select(adapter, enc, m, config.budget, cache=c, **config.params)
        return inllm.generate(adapter, enc, sel, layer=sel.extras["layer"], max_new_tokens=max_new_tokens, cache=c)
    sel = mipruner.prune(m, visual=enc.visual, text=enc.scoring_text, budget=config.budget,
                         **prune_kwargs(m, enc, config.params, None, cache))
    return adapter.generate(enc, keep=sel, max_new_tokens=max_new_tokens)
