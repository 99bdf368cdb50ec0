"""`Param`: one method parameter (default, range or choices, one-line doc), from which the app's controls, the
settings string, the eval and lmms-eval arguments are generated. Re-exported by `_registry` (`mipruner.Param`)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Param:
    """One method parameter: its default, its range (numbers) or choices (strings), a one-line doc.

    kind: "float", "int" or "choice". low/high bound numbers (None: unbounded); low_open excludes
    `low`, high_open `high` (EVS's rate in [0, 1)). code: its key in the app's settings string (default: the
    name). step: the UI's slider step.
    """

    name: str
    default: Any
    kind: str
    doc: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple = ()
    high_open: bool = False
    code: str = ""
    step: float | None = None

    def __post_init__(self):
        if self.kind not in ("float", "int", "choice"):
            raise ValueError(f"Param {self.name!r}: kind must be float, int or choice, got {self.kind!r}")
        if self.kind == "choice" and not self.choices:
            raise ValueError(f"Param {self.name!r}: a choice needs choices")
        if not self.code:
            object.__setattr__(self, "code", self.name)
        self.validate(self.default)

    def validate(self, value: Any) -> Any:
        """`value` converted to the parameter's type, or ValueError naming the parameter and its range."""
        if self.kind == "choice":
            if value not in self.choices:
                raise ValueError(f"{self.name} must be one of {self.choices}, got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{self.name} must be {'an int' if self.kind == 'int' else 'a number'}, got {value!r}")
        if self.kind == "int":
            if not float(value).is_integer():
                raise ValueError(f"{self.name} must be an int, got {value!r}")
            value = int(value)
        else:
            value = float(value)
            if math.isnan(value):
                raise ValueError(f"{self.name} must be a number, got nan")
        lo_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        hi_ok = self.high is None or (value < self.high if self.high_open else value <= self.high)
        if not (lo_ok and hi_ok and (self.kind == "int" or math.isfinite(value))):
            lo = "-inf" if self.low is None else self.low
            hi = "inf" if self.high is None else self.high
            raise ValueError(f"{self.name} must be in {'(' if self.low_open else '['}{lo}, {hi}"
                             f"{')' if self.high_open else ']'}, got {value}")
        return value

    @classmethod
    def real(cls, name: str, default: float, low: float | None, high: float | None, doc: str, **kw) -> "Param":
        return cls(name, default, "float", doc, low=low, high=high, **kw)

    @classmethod
    def integer(cls, name: str, default: int, low: int | None, high: int | None, doc: str, **kw) -> "Param":
        return cls(name, default, "int", doc, low=low, high=high, **kw)

    @classmethod
    def choice(cls, name: str, default: str, choices: tuple[str, ...], doc: str, **kw) -> "Param":
        return cls(name, default, "choice", doc, choices=tuple(choices), **kw)


__all__ = ["Param"]
