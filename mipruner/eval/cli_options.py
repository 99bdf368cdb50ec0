"""The command lines' options for method parameters: one `--name` per registered `Param`
(`--lam`, `--tau`, `--layer`, ...), read back validated. Shared by `python -m mipruner.eval` and its
`sweep` subcommand."""
from __future__ import annotations

import argparse

from mipruner.pruners import all_params

NOT_OPTIONS = ("seed",)  # Random runs seeds 0, 1, 2 and averages them (runner.RANDOM_SEEDS); --seed is the scenes'.


def add_param_options(p: argparse.ArgumentParser) -> None:
    """One option per registered method parameter (`--lam`, `--tau`, `--layer`, ...), from the specs."""
    for prm in all_params().values():
        if prm.name in NOT_OPTIONS:
            continue
        kw = {"choices": [str(c) for c in prm.choices]} if prm.kind == "choice" else \
            {"type": int if prm.kind == "int" else float}
        p.add_argument(f"--{prm.name.replace('_', '-')}", dest=f"param_{prm.name}", default=None,
                       help=f"{prm.doc} (default: {prm.default})".replace("%", "%%"), **kw)  # argparse formats help


def param_values(a: argparse.Namespace) -> dict:
    """{parameter: value} of the options given, validated by their Param (choices keep their type)."""
    out = {}
    for prm in all_params().values():
        if prm.name in NOT_OPTIONS:
            continue
        v = getattr(a, f"param_{prm.name}", None)
        if v is None:
            continue
        if prm.kind == "choice":
            v = next(c for c in prm.choices if str(c) == v)
        try:
            out[prm.name] = prm.validate(v)
        except ValueError as e:
            raise SystemExit(f"--{prm.name.replace('_', '-')}: {e}") from None
    return out
