"""Sweeps: one parameter over a question set, for several methods, each item encoded once (`run.py`); what
a sweep is (`spec.py`), its question sets (`sets.py`), its results (`result.py`) and curves (`plot.py`),
and the headless command (`cli.py`, `python -m mipruner.eval sweep`)."""
from .run import (COLUMNS, GENERATED, METRICS, SPECIAL, Sweep, SweepResult, SweepRun, describe, generated_set,
                  media_bytes, parse_value, parse_values, reusable, run_sweep, summarise, sweepable, unpacked_set,
                  user_set)
from .sets import media_kind, zip_kinds

__all__ = ["COLUMNS", "GENERATED", "METRICS", "SPECIAL", "Sweep", "SweepResult", "SweepRun", "describe", "generated_set",
           "media_bytes", "parse_value", "parse_values", "reusable", "run_sweep", "summarise", "sweepable",
           "unpacked_set", "user_set", "media_kind", "zip_kinds"]
