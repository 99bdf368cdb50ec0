"""One item, one method: select the visual tokens and answer. Plus the method settings' checks.

`answer(adapter, media, prompt, config)` is the whole "select + answer" path of the lmms-eval
model: exactly what `python -m mipruner.eval` calls for one item and one (method, budget) —
`adapter.encode`, `mipruner.select` and `mipruner.answer`, for every registered method whatever
its stage — so both give the same answers on the same items.

`MethodConfig.parse(...)` turns the `--model_args` of lmms-eval (already converted to int / float
/ bool / str by lmms-eval) into a checked configuration, with plain errors.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import mipruner
from mipruner.models.common.text import TEXT_MODES
from mipruner.pruners import check_budget, did_you_mean, get_pruner, list_pruners
from mipruner.pruners.signals import encode_kwargs

NONE = "none"  # answer on every visual token (the unpruned baseline)


def method_names() -> list[str]:
    return [NONE] + list_pruners()


def _method_params(method: str) -> dict:
    """name -> default of the settings `method` accepts (its registered Params)."""
    return {} if method == NONE else get_pruner(method).defaults()


def parse_budget(value) -> int | float:
    """An int >= 1 (tokens), a float in (0, 1] (share of the visual tokens) or "25%" (a share)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text[:-1]) / 100 if text.endswith("%") else (float(text) if "." in text else int(text))
        except ValueError:
            raise ValueError(f"budget must be a token count (64), a share (0.25) or a percentage (25%), "
                             f"got {value!r}") from None
    return check_budget(value)


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
            raise did_you_mean("method", method, method_names())
        if text_mode not in TEXT_MODES:
            raise ValueError(f"text_mode must be one of {', '.join(TEXT_MODES)}, got {text_mode!r}")
        accepted = _method_params(method)
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            known = ", ".join(sorted(accepted)) or "none"
            raise ValueError(f"method {method!r} has no setting(s) {', '.join(unknown)}; its settings: {known}")
        clean = {}
        for k, v in params.items():
            prm = get_pruner(method).param(k)
            if prm.kind == "choice" and isinstance(v, str):  # lmms-eval passes "None"/"True" as text
                v = next((c for c in prm.choices if str(c) == v), v)
            try:
                clean[k] = prm.validate(v)  # lam=1 on the command line becomes the float 1.0
            except ValueError as e:
                raise ValueError(f"{method}: {e}") from None
        if method == NONE:
            if budget is not None:
                raise ValueError("method=none keeps every visual token: drop budget=")
            return cls(NONE, None, {}, text_mode)
        if budget is None:
            raise ValueError(f"method {method!r} needs a budget: budget=64 (tokens), budget=0.25 or budget=25%")
        return cls(method, parse_budget(budget), clean, text_mode)

    @property
    def needs_attention(self) -> bool:
        return self.signals.attention

    @property
    def signals(self):
        """What its method reads of the vision encoder (`mipruner.signals_for`)."""
        return mipruner.signals_for([] if self.method == NONE else [self.method])

    def key(self) -> str:
        """A stable string naming this configuration (for the answer cache)."""
        return json.dumps({"method": self.method, "budget": self.budget, "params": self.params,
                           "text_mode": self.text_mode}, sort_keys=True, default=str)


def answer(adapter, media, prompt: str, config: MethodConfig, max_new_tokens: int):
    """Encode `media` + `prompt`, keep the visual tokens `config` selects, answer greedily (an Answer)."""
    enc = adapter.encode(media, prompt, text_mode=config.text_mode, **encode_kwargs(config.signals))
    return answer_encoded(adapter, enc, config, max_new_tokens)


def answer_encoded(adapter, enc, config: MethodConfig, max_new_tokens: int, cache: dict | None = None,
                   computes: list | None = None):
    """The answer of `config` on an encoding. `cache`: one dict per encoding, shared by the methods and
    budgets answered on it (MI's PMI matrices, FastV/DART's first K layers), as in the eval runner.
    computes: a list the selection's prefill compute (`mipruner.measure.compute.Compute`) is appended to."""
    if config.method == NONE:
        if computes is not None:
            from mipruner.measure.compute import selection_compute

            computes.append(selection_compute(adapter, enc, None))
        return mipruner.answer(adapter, enc, None, max_new_tokens=max_new_tokens)
    cache = {} if cache is None else cache
    sel = mipruner.select(adapter, enc, config.method, config.budget, cache=cache, **config.params)
    if computes is not None:
        computes.append(sel.extras.get("compute"))
    return mipruner.answer(adapter, enc, sel, max_new_tokens=max_new_tokens, cache=cache)


def compute_summary(computes: list) -> str | None:
    """One line: the mean shares of the unpruned prefill FLOPs, visual-token-layers and KV cache of
    the answers computed (None when none was counted)."""
    cs = [c for c in computes if c is not None]
    if not cs:
        return None
    mean = lambda k: 100 * sum(getattr(c, k) for c in cs) / len(cs)  # noqa: E731
    return (f"prefill FLOPs {mean('flops_share'):.1f}% of unpruned, visual-token-layers "
            f"{mean('visual_token_layers_share'):.1f}%, KV cache {mean('kv_share'):.1f}% (mean over {len(cs)} answers)")
