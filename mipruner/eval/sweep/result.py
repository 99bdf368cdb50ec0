"""A sweep's result: rows per (method, value, split) summarised from the per-item records, and
the files (CSV, JSON, PNG) and text table made from them. See `mipruner.eval.sweep.run`."""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

from mipruner.pruners import get_pruner
from mipruner.measure.text_table import table

from ..runner import RANDOM_SEEDS, aggregate
from .spec import Sweep

METRICS = ("acc", "f1", "yes_rate", "query_recall", "kept", "prune_ms", "prefill_ms")
COLUMNS = ("method", "label", "param", "value", "split", "varies", *METRICS, "flops", "lam", "n")


def _finite(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else math.nan


def summarise(sweep, records: list[dict]) -> list[dict]:
    """Rows per (method, value, split), plus "average" over splits when there are several."""
    if not records:
        return []
    tuples = [(r["method"], "all" if r["value"] is None else r["value"], r["seed"],
               SimpleNamespace(split=r["split"], kind=r["kind"], answer=r["answer"]), r["prediction"],
               math.nan if r["query_recall"] is None else r["query_recall"], None, r.get("error")) for r in records]
    rows = []
    for row in aggregate(tuples, "sweep"):
        m, v, split = row["method"], row["budget"], row["split"]
        value = None if m == "none" else v
        mine = [r for r in records if r["method"] == m and r["value"] == value and split in ("average", r["split"])]
        out = {"method": m, "label": "unpruned" if m == "none" else get_pruner(m).label, "param": sweep.param,
               "value": value, "split": split, "varies": m != "none" and sweep.varies(m),
               **{k: row[k] for k in ("acc", "f1", "yes_rate", "query_recall")},
               **{k: _mean([r.get(k) for r in mine]) for k in ("kept", "prune_ms", "prefill_ms", "lam", "flops")},
               "n": row["n"]}
        rows.append(out)
        if m != "none" and not out["varies"]:
            rows += [{**out, "value": other} for other in sweep.values[1:]]
    return rows


@dataclass
class SweepResult:
    """A finished (or cancelled) sweep: `rows` per (method, value, split) and per-item `records`."""

    sweep: Sweep
    rows: list
    records: list
    n_items: int
    n_encodes: int
    wall_s: float
    cancelled: bool = False
    set_name: str = ""
    set_info: dict = field(default_factory=dict)
    model: str = ""
    n_llm_calls: int = 0  # answers the LLM computed (the others were reused: same kept tokens)

    @property
    def overall(self) -> str:
        """The split the curves show: "average" over several splits, else the only one."""
        splits = {r["split"] for r in self.rows}
        return "average" if "average" in splits else next(iter(splits), "all")

    @property
    def failures(self) -> list[tuple[str, str, int]]:
        """(method, first sentence, failed records) of every method that failed on some item."""
        out: dict = {}
        for r in self.records:
            if r.get("error"):
                why, n = out.get(r["method"], (r["error"], 0))
                out[r["method"]] = (why, n + 1)
        return [(m, why, n) for m, (why, n) in out.items()]

    def points(self, method: str) -> list[dict]:
        """The overall rows of `method`, in the order of the swept values."""
        rows = [r for r in self.rows if r["method"] == method and r["split"] == self.overall]
        order = {v: i for i, v in enumerate(self.sweep.values)}
        return sorted(rows, key=lambda r: order.get(r["value"], -1))

    def reference(self) -> dict | None:
        """The unpruned model's overall row."""
        return next(iter(self.points("none")), None)

    def to_dict(self) -> dict:
        clean = lambda rows: [{k: _finite(v) for k, v in r.items()} for r in rows]  # noqa: E731
        return {"model": self.model, "set": self.set_name, "set_info": self.set_info, "sweep": self.sweep.to_dict(),
                "n_items": self.n_items, "n_encodes": self.n_encodes, "n_llm_calls": self.n_llm_calls,
                "wall_s": round(self.wall_s, 3),
                "cancelled": self.cancelled, "rows": clean(self.rows), "records": clean(self.records)}

    @classmethod
    def from_json(cls, path: str) -> "SweepResult":
        """A result written by `to_json` (re-plot or re-tabulate without running the model)."""
        with open(path) as f:
            doc = json.load(f)
        sw = doc["sweep"]
        nan = lambda rows: [{k: (math.nan if v is None and k in (*METRICS, "lam", "flops") else v)  # noqa: E731
                             for k, v in r.items()} for r in rows]
        return cls(Sweep(methods=tuple(sw["methods"]), param=sw["param"], values=tuple(sw["values"]),
                         budget=sw["budget"], params=sw["params"], text_mode=sw["text_mode"],
                         max_new_tokens=sw["max_new_tokens"], seeds=tuple(sw.get("seeds", RANDOM_SEEDS))),
                   nan(doc["rows"]), doc["records"], doc["n_items"], doc["n_encodes"], doc["wall_s"], doc["cancelled"],
                   doc["set"], doc["set_info"], doc["model"], doc.get("n_llm_calls", 0))

    def to_json(self, path: str) -> str:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
        return path

    def to_csv(self, path: str) -> str:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            w.writeheader()
            for r in self.rows:
                w.writerow({k: ("" if _finite(r.get(k)) is None else r.get(k)) for k in COLUMNS})
        return path

    def plot(self, path: str | None = None, *, x: str = "value", metrics=None, others=()):
        """The curves (see `plot.plot_sweep`); saved as PNG when `path` is given. others: more
        results of the same set drawn on the same axes (x = "kept")."""
        from .plot import plot_sweep

        return plot_sweep([self, *others] if others else self, path, x=x, metrics=metrics)

    def table(self) -> str:
        """The overall rows as a text table."""
        fmt = lambda v: "-" if v is None or isinstance(v, float) and math.isnan(v) else (  # noqa: E731
            f"{v:.3f}" if isinstance(v, float) else str(v))
        keys = ("acc", "f1", "yes_rate", "query_recall", "kept", "prune_ms", "prefill_ms", "flops")
        body = [[r["method"], fmt(r["value"]), *[fmt(r.get(k, math.nan)) for k in keys], str(r["n"])]
                for m in ("none", *self.sweep.methods) for r in self.points(m)]
        return table(body, ["method", self.sweep.param, *keys, "n"])

    def at_compute(self, share: float) -> list[dict]:
        """Per method, its overall row whose `flops` (share of the unpruned prefill FLOPs) is closest
        to `share` (the first swept value on ties); its `value` says which budget that was, and
        `same_flops` lists the other swept values whose `flops` equal it exactly (e.g. a method that
        withdraws every visual token at one layer costs the same at any budget). Rows without a FLOPs
        figure (a model with no decoder to count) are left out."""
        out = []
        for m in self.sweep.methods:
            pts = [r for r in self.points(m) if _finite(r.get("flops")) is not None]
            if pts:
                best = min(pts, key=lambda r: abs(r["flops"] - share))
                out.append({**best, "same_flops": [r["value"] for r in pts
                                                   if r is not best and r["flops"] == best["flops"]]})
        return out

    def table_at_compute(self, share: float) -> str:
        """`at_compute(share)` as a text table."""
        fmt = lambda v: "-" if v is None or isinstance(v, float) and math.isnan(v) else (  # noqa: E731
            f"{v:.3f}" if isinstance(v, float) else str(v))
        keys = ("acc", "f1", "yes_rate", "query_recall", "kept", "flops")
        value = lambda r: fmt(r["value"]) + (f" (same FLOPs at {','.join(fmt(v) for v in r['same_flops'])})"  # noqa: E731
                                             if r["same_flops"] else "")
        body = [[r["method"], value(r), *[fmt(r.get(k, math.nan)) for k in keys], str(r["n"])]
                for r in self.at_compute(share)]
        return table(body, ["method", f"{self.sweep.param} (at ~{100 * share:g}% FLOPs)", *keys, "n"])




__all__ = ["COLUMNS", "METRICS", "SweepResult", "summarise"]
