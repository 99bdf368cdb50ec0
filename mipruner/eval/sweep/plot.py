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


MARKERS = ("o", "s", "^", "D")


def _color(i: int, n: int):
    """Matplotlib's ten default colours, then tab20's light shades (with other markers)."""
    if i < 10:
        return f"C{i}"
    from matplotlib import colormaps

    return colormaps["tab20"]((2 * (i - 10) + 1) % 20)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def available(result, x: str = "value") -> list[str]:
    """The metrics with at least one finite value (kept is the x axis when x == "kept")."""
    if isinstance(result, (list, tuple)):
        found = set().union(*(available(r, x) for r in result))
        return [k for k in PLOTTED if k in found]
    rows = [r for m in result.sweep.methods for r in result.points(m)]
    out = [k for k in PLOTTED if not (k == "kept" and x == "kept") and any(_finite(r.get(k)) for r in rows)]
    if result.sweep.param == "budget":  # fixed budgets in tokens: kept is the x axis itself
        plain = all(isinstance(r["value"], int) and r["kept"] == r["value"] for r in rows)
    else:  # one fixed budget: kept says something only when it moves (an adaptive K, a share of N_V)
        plain = len({r["kept"] for r in rows}) <= 1
    if plain:
        out = [k for k in out if k != "kept"]
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


def _line_label(result, method: str, label: str, overlay: bool) -> str:
    """The legend entry; overlaid sweeps also name their fixed parameters and swept range."""
    sw = result.sweep
    if not overlay:
        return label
    from mipruner.pruners import get_pruner

    own = [f"{k} {v}" for k, v in sw.params.items() if k in get_pruner(method).param_names]
    label += f" [{', '.join(own)}]" if own else ""
    return label if sw.param == "budget" else f"{label}: {sw.param} {sw.values[0]}..{sw.values[-1]}"


def plot_sweep(result, path: str | None = None, *, x: str = "value", metrics=None, dpi: int = 80):
    """A matplotlib Figure of the sweep's curves; also written as PNG to `path` when given.

    result: one SweepResult, or several of one question set to overlay against x = "kept" (e.g. MI
    at fixed budgets beside `mi_adaptive` sweeping its gain_ratio); the first one titles the figure.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    if x not in X_AXES:
        raise ValueError(f"x must be one of {X_AXES}, got {x!r}")
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    if len(results) > 1 and x != "kept":
        raise ValueError("several sweeps share one axis only as x='kept' (mean tokens kept)")
    result, overlay = results[0], len(results) > 1
    lines = [(r, m) for r in results for m in r.sweep.methods]
    sw = result.sweep
    metrics = [k for k in (metrics or available(results, x)) if k in PLOTTED and not (k == "kept" and x == "kept")]
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
        for i, (res, m) in enumerate(lines):
            pts = [p for p in res.points(m) if _finite(p.get(key))]
            if x == "kept":
                pts = [p for p in pts if _finite(p.get("kept"))]
                xs = [p["kept"] for p in pts]
            else:
                xs = [position[p["value"]] for p in pts]
            if not pts:
                continue
            xs_all += xs
            varies = pts[0]["varies"]
            ax.plot(xs, [p[key] for p in pts], marker=MARKERS[i // 10 % len(MARKERS)] if varies else None,
                    ls="-" if varies else "--", color=_color(i, len(lines)),
                    label=_line_label(res, m, pts[0]["label"], overlay), lw=1.8, ms=4)
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
    entry_in = 0.6 + 0.075 * max(len(lab) for lab in labels)  # inches one legend entry takes at fontsize 9
    per_row = max(1, min(len(labels), 6, int(fig.get_figwidth() // entry_in)))
    fig.legend(handles, labels, loc="outside lower center", ncols=per_row, fontsize=9, frameon=False)
    fig.suptitle(_title(result) + (f" (+ {len(results) - 1} more sweeps)" if overlay else ""), fontsize=10)
    if path:
        fig.savefig(path, dpi=dpi)
        if path.lower().endswith(".png"):  # a palette PNG: a third of the size, the same picture to the eye
            from PIL import Image

            with Image.open(path) as im:
                small = im.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
            small.save(path, optimize=True)
    return fig


__all__ = ["LABELS", "PLOTTED", "X_AXES", "available", "plot_sweep"]
