"""The curves of a sweep: one panel per metric, one line per method, the unpruned model dotted.

x = "value": the swept values (a numeric axis, log-scaled for budgets spanning 8x or more; a
categorical one for choices such as `aggregation` or `text_mode`); x = "kept": the mean number of
tokens kept, which puts adaptive budgets (`mi_adaptive`) beside fixed ones. A method that does not
take the swept parameter is drawn dashed (flat). Uses matplotlib's object API (no pyplot state), so
it is safe in the app's worker threads.
"""
from __future__ import annotations

import math

LABELS = {"acc": "accuracy", "f1": "F1 (yes/no)", "yes_rate": "yes-rate", "query_recall": "query recall",
          "kept": "tokens kept (mean)", "prune_ms": "select ms (mean)", "prefill_ms": "LLM prefill ms (mean)"}
PLOTTED = tuple(LABELS)
X_AXES = ("value", "kept")


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def available(result, x: str = "value") -> list[str]:
    """The metrics with at least one finite value (kept is the x axis when x == "kept")."""
    rows = [r for m in result.sweep.methods for r in result.points(m)]
    out = [k for k in PLOTTED if not (k == "kept" and x == "kept") and any(_finite(r.get(k)) for r in rows)]
    if result.sweep.param == "budget" and all(isinstance(r["value"], int) and r["kept"] == r["value"] for r in rows):
        out = [k for k in out if k != "kept"]  # fixed budgets in tokens: kept is the x axis itself
    return out


def _title(result) -> str:
    sw = result.sweep
    fixed = [] if sw.param == "budget" else [f"budget {sw.budget}"]
    fixed += [f"{k} {v}" for k, v in sw.params.items()]
    if sw.param != "text_mode":
        fixed.append(f"text {sw.text_mode}")
    head = f"{result.model + ': ' if result.model else ''}{result.set_name or 'items'} ({result.n_items} items"
    head += ", cancelled)" if result.cancelled else ")"
    return f"{head} · sweep of {sw.param}" + (f" · {', '.join(fixed)}" if fixed else "")


def plot_sweep(result, path: str | None = None, *, x: str = "value", metrics=None, dpi: int = 80):
    """A matplotlib Figure of the sweep's curves; also written as PNG to `path` when given."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    if x not in X_AXES:
        raise ValueError(f"x must be one of {X_AXES}, got {x!r}")
    sw = result.sweep
    metrics = [k for k in (metrics or available(result, x)) if k in PLOTTED and not (k == "kept" and x == "kept")]
    if not metrics:
        raise ValueError("nothing to plot: the sweep holds no finished item")
    numeric = all(_finite(v) for v in sw.values)
    position = {v: (v if numeric else i) for i, v in enumerate(sw.values)}
    ncols = min(len(metrics), 3 if len(metrics) <= 6 else 4)
    nrows = math.ceil(len(metrics) / ncols)
    fig = Figure(figsize=(4.2 * ncols, 3.2 * nrows + 0.8), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).flatten()
    ref = result.reference()
    xs_all = []
    for ax, key in zip(axes, metrics):
        for i, m in enumerate(sw.methods):
            pts = [p for p in result.points(m) if _finite(p.get(key))]
            if x == "kept":
                pts = [p for p in pts if _finite(p.get("kept"))]
                xs = [p["kept"] for p in pts]
            else:
                xs = [position[p["value"]] for p in pts]
            if not pts:
                continue
            xs_all += xs
            varies = pts[0]["varies"]
            ax.plot(xs, [p[key] for p in pts], marker="o" if varies else None, ls="-" if varies else "--",
                    color=f"C{i}", label=pts[0]["label"], lw=1.8, ms=4)
        if ref is not None and _finite(ref.get(key)) and key not in ("kept", "prune_ms"):
            ax.axhline(ref[key], color="0.45", ls=":", lw=1.2, label="unpruned")
        ax.set_title(LABELS[key], fontsize=10)
        ax.grid(alpha=0.3)
        if key in ("acc", "f1", "yes_rate", "query_recall"):
            ax.set_ylim(-0.03, 1.03)
    for ax in axes[len(metrics):]:
        ax.set_visible(False)
    xlabel = "tokens kept (mean over items)" if x == "kept" else sw.param
    pos = [v for v in xs_all if _finite(v) and v > 0]
    log = (x == "kept" or sw.param == "budget" and numeric) and pos and len(pos) == len(xs_all) \
        and max(pos) / min(pos) >= 8
    for ax in axes[:len(metrics)]:
        ax.set_xlabel(xlabel, fontsize=9)
        if log:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_formatter(NullFormatter())
        if x == "value":  # a tick at each swept value
            ticks = [position[v] for v in sw.values]
            ax.set_xticks(ticks, [f"{v:g}" if numeric else str(v) for v in sw.values])
    seen: dict = {}
    for ax in axes[:len(metrics)]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    handles, labels = list(seen.values()), list(seen)
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 6), fontsize=9, frameon=False)
    fig.suptitle(_title(result), fontsize=10)
    if path:
        fig.savefig(path, dpi=dpi)
    return fig


__all__ = ["LABELS", "PLOTTED", "X_AXES", "available", "plot_sweep"]
