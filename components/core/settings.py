"""The app's settings and their compact string form, generated from the method registry's specs.

    m=mi,random&b=64&tm=question&ht=-1&lam=0.5&tau=0.1&agg=max&...

Four fields are the app's own (methods `m`, budget `b`: tokens as an int or a share as a float in
(0, 1], the prompt tokens scored `tm`, the heatmap's prompt token `ht`, -1 for each method's
scores); every other field is a registered method parameter under its `Param.code`, so a method
registered with a new parameter appears here, in the controls and in the string with no edit.
Invalid values raise ValueError naming the field.
"""
from __future__ import annotations

from typing import Any

from mipruner.serve.service import TEXT_MODES, check_budget, method_spec
from mipruner.serve.service import parameters as all_params
from .messages import short

FIELDS = {"methods": "m", "budget": "b", "text_mode": "tm", "heat": "ht"}
DEFAULT_METHODS = ("mi", "random", "similarity", "attention")


def _bad(name: str, msg: str):
    code = FIELDS.get(name) or all_params()[name].code
    raise ValueError(f"settings field {code!r} ({name}): {msg}")


class Settings:
    """Validated, immutable app settings: the four app fields plus every registered parameter
    (missing ones take their defaults). `params` is the one dict every method takes its own from."""

    __slots__ = ("methods", "budget", "text_mode", "heat", "_params")

    def __init__(self, methods=DEFAULT_METHODS, budget: int | float = 64, text_mode: str = "question",
                 heat: int = -1, **params):
        methods = (methods,) if isinstance(methods, str) else tuple(methods)
        if not methods:
            _bad("methods", "at least one method is needed")
        for m in methods:
            try:
                method_spec(m)
            except ValueError as e:
                _bad("methods", str(e))
        if len(set(methods)) != len(methods):
            _bad("methods", f"duplicate methods in {list(methods)}")
        try:
            b = check_budget(budget)
        except ValueError as e:
            _bad("budget", str(e))
        if text_mode not in TEXT_MODES:
            _bad("text_mode", f"must be one of {TEXT_MODES}, got {text_mode!r}")
        if isinstance(heat, bool) or not isinstance(heat, int) or heat < -1:
            _bad("heat", f"must be a prompt-token index >= 0, or -1 for none, got {heat!r}")
        known = all_params()
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise ValueError(f"settings: unknown parameter(s) {unknown}; known: {sorted(known)}")
        values = {}
        for name, p in known.items():
            try:
                values[name] = p.validate(params.get(name, p.default))
            except ValueError as e:
                _bad(name, str(e))
        for k, v in (("methods", methods), ("budget", b), ("text_mode", text_mode), ("heat", heat),
                     ("_params", values)):
            object.__setattr__(self, k, v)

    def __setattr__(self, name, value):
        raise AttributeError("Settings are immutable: make a new one (Settings.replace)")

    def __getstate__(self) -> dict:  # pickled (a ZeroGPU worker receives its handler's settings)
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)

    @property
    def params(self) -> dict[str, Any]:
        """{parameter: value} for every registered parameter (a fresh dict)."""
        return dict(self._params)

    def replace(self, **changes) -> "Settings":
        kw = {"methods": self.methods, "budget": self.budget, "text_mode": self.text_mode, "heat": self.heat,
              **self._params}
        return Settings(**{**kw, **changes})

    def __eq__(self, other) -> bool:
        return isinstance(other, Settings) and self.to_string() == other.to_string()

    def __hash__(self) -> int:
        return hash(self.to_string())

    def __repr__(self) -> str:
        return f"Settings({self.to_string()!r})"

    def to_string(self) -> str:
        vals = {"m": ",".join(self.methods), "b": repr(self.budget) if isinstance(self.budget, float)
                else str(self.budget), "tm": self.text_mode, "ht": str(self.heat)}
        for name, p in all_params().items():
            v = self._params[name]
            vals[p.code] = repr(float(v)) if p.kind == "float" else str(v)
        return "&".join(f"{k}={v}" for k, v in vals.items())

    @classmethod
    def parse(cls, s: str) -> "Settings":
        """Settings from `to_string`'s form; missing fields take defaults, unknown ones raise."""
        by_code: dict = {c: name for name, c in FIELDS.items()}
        by_code.update({p.code: p for p in all_params().values()})
        kw: dict[str, Any] = {}
        for part in (p for p in s.strip().lstrip("?").split("&") if p):
            code, sep, val = part.partition("=")
            code, val = code.strip(), val.strip()
            if not sep:
                raise ValueError(f"settings field {short(code)}: expected <field>=<value>")
            if code not in by_code:
                raise ValueError(f"settings field {short(code)} is unknown; known fields: {', '.join(by_code)}")
            target = by_code[code]
            name = target if isinstance(target, str) else target.name
            if name in kw:
                raise ValueError(f"settings field {short(code)} is given twice")
            try:
                kw[name] = _read(target, val)
            except ValueError:
                raise ValueError(f"settings field {code!r} ({name}): cannot read {short(val)}") from None
        return cls(**kw)


def _read(target, val: str) -> Any:
    """One field's value from its text."""
    if target == "methods":
        return tuple(m.strip() for m in val.split(",") if m.strip())
    if target == "budget":
        return float(val) if any(c in val for c in ".eE") else int(val)
    if target == "heat":
        return int(val)
    if isinstance(target, str):
        return val
    if target.kind == "choice":
        for c in target.choices:
            if str(c) == val:
                return c
        raise ValueError(val)
    return int(val) if target.kind == "int" else float(val)


__all__ = ["DEFAULT_METHODS", "FIELDS", "Settings"]
