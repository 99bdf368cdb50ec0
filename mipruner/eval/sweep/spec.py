"""What a sweep varies and holds fixed: the `Sweep` record and the parsing of swept values.

Kept apart from the running (`run.py`) and the results (`result.py`), which both read it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from mipruner.models.common.text import TEXT_MODES
from mipruner.pruners import all_params, check_budget, did_you_mean, get_pruner

from ..runner import RANDOM_SEEDS

SPECIAL = ("budget", "text_mode")  # sweepable besides the registered parameters


def sweepable() -> list[str]:
    """Names a sweep can vary: budget, text_mode and every registered method parameter."""
    return [*SPECIAL, *all_params()]


def parse_value(param: str, value):
    """One value of `param`, from text or a number, validated (ValueError names the parameter)."""
    if param == "budget":
        if isinstance(value, str):
            t = value.strip()
            try:
                value = float(t) if any(c in t for c in ".eE") else int(t)
            except ValueError:  # "NaN", "ten", "1/2": a sentence, not int()'s wording
                raise ValueError(f"budget must be a number (tokens, or a share in (0, 1]), got {t[:40]!r}") from None
        return check_budget(value)
    if param == "text_mode":
        if str(value).strip() not in TEXT_MODES:
            raise ValueError(f"text_mode must be one of {TEXT_MODES}, got {value!r}")
        return str(value).strip()
    params = all_params()
    if param not in params:
        raise did_you_mean("parameter to sweep", param, sweepable())
    p = params[param]
    if isinstance(value, str):
        t = value.strip()
        if p.kind == "choice":
            value = next((c for c in p.choices if str(c) == t), t)
        else:
            try:
                value = int(t) if p.kind == "int" and t.lstrip("+-").isdigit() else float(t)
            except ValueError:
                raise ValueError(f"{param} must be a number, got {t!r}") from None
    return p.validate(value)


def parse_values(param: str, values) -> tuple:
    """The values of a sweep from "a,b,c" or a list; at least one, no duplicates."""
    if isinstance(values, str):
        values = [v for v in values.split(",") if v.strip()]
    out = tuple(parse_value(param, v) for v in values)
    if not out:
        raise ValueError(f"give at least one value of {param}")
    if len(set(out)) != len(out):
        raise ValueError(f"duplicate values of {param}: {list(out)}")
    return out


@dataclass(frozen=True)
class Sweep:
    """What to sweep (see the module docstring). Validated on construction."""

    methods: tuple
    param: str
    values: tuple
    budget: int | float = 16
    params: dict = field(default_factory=dict, hash=False)
    text_mode: str = "question"
    max_new_tokens: int = 8
    seeds: tuple = RANDOM_SEEDS  # of methods with a `seed` parameter (Random), averaged

    def __post_init__(self):
        methods = (self.methods,) if isinstance(self.methods, str) else tuple(self.methods)
        if not methods or len(set(methods)) != len(methods):
            raise ValueError(f"give one or more distinct methods, got {list(methods)}")
        for m in methods:
            get_pruner(m)
        if self.param not in SPECIAL and self.param not in all_params():
            raise did_you_mean("parameter to sweep", self.param, sweepable())
        values = parse_values(self.param, self.values)
        known = all_params()
        params = {}
        for k, v in dict(self.params).items():
            if k not in known:
                raise did_you_mean("method parameter", k, list(known))
            params[k] = parse_value(k, v)
        if self.param == "lam":
            params.setdefault("lam_rule", "fixed")
        if self.param in params:
            raise ValueError(f"{self.param} is swept: do not also fix it")
        if not any(self.varies(m) for m in methods):
            raise ValueError(f"none of {list(methods)} takes {self.param!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        seeds = tuple(parse_values("seed", self.seeds)) if "seed" in known else ()
        for k, v in (("methods", methods), ("values", values), ("params", params), ("seeds", seeds),
                     ("budget", parse_value("budget", self.budget)), ("text_mode", parse_value("text_mode", self.text_mode))):
            object.__setattr__(self, k, v)

    def varies(self, method: str) -> bool:
        """Whether `method`'s result depends on the swept parameter."""
        spec = get_pruner(method)
        if self.param == "budget":
            return True
        if self.param == "text_mode":
            return spec.needs_text
        return self.param in spec.param_names

    def setting(self, method: str, value) -> tuple:
        """(budget, text_mode, params) for `method` at `value` of the swept parameter."""
        budget, mode, params = self.budget, self.text_mode, dict(self.params)
        if self.param == "budget":
            budget = value
        elif self.param == "text_mode":
            mode = value if self.varies(method) else self.values[0]
        else:
            params[self.param] = value
        return budget, mode, params

    def seeds_of(self, method: str) -> tuple:
        """The seeds a method runs with (Random: `seeds` unless `seed` is fixed or swept)."""
        if "seed" not in get_pruner(method).param_names or self.param == "seed" or "seed" in self.params:
            return (None,)
        return self.seeds

    def to_dict(self) -> dict:
        return {"methods": list(self.methods), "param": self.param, "values": list(self.values),
                "budget": self.budget, "params": dict(self.params), "text_mode": self.text_mode,
                "max_new_tokens": self.max_new_tokens, "seeds": list(self.seeds)}

    def key(self) -> str:
        """A canonical string of the sweep (for caches)."""
        return json.dumps(self.to_dict(), sort_keys=True)
