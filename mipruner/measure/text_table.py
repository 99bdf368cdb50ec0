"""A plain text table, for the command lines' printed results (eval, sweeps, lmms-eval, benches)."""
from __future__ import annotations


def table(rows: list[list[str]], header: list[str]) -> str:
    """A plain left/right aligned text table."""
    cols = [header] + rows
    widths = [max(len(str(r[i])) for r in cols) for i in range(len(header))]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(header), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows])
