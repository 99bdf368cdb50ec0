"""One selection with its scores, PMI and geometry as JSON (what the app's downloads hold)."""
from __future__ import annotations

import json
import math

from ..pruners import Selection


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def selection_to_json(encoded, selection: Selection, *, indent: int | None = None) -> str:
    """One selection with its scores, PMI and geometry as JSON (non-finite numbers -> null)."""
    geo = encoded.geometry
    doc = {
        "model": encoded.model, "prompt": encoded.prompt, "text_mode": encoded.text_mode,
        "method": selection.method, "n_visual": encoded.n_visual, "kept": selection.budget,
        "keep": selection.keep.tolist(), "order": selection.order.tolist(),
        "scores": [_finite(v) for v in selection.scores.tolist()],
        "text_tokens": list(encoded.scoring_tokens),
        "geometry": {"frame": geo.frame.tolist(), "row": geo.row.tolist(), "col": geo.col.tolist(),
                     "box": geo.box.tolist(), "kind": list(geo.kind), "grids": [list(g) for g in geo.grids],
                     "sizes": [list(s) for s in geo.sizes]},
    }
    if selection.pmi is not None:
        doc["pmi"] = [[_finite(v) for v in row] for row in selection.pmi.tolist()]
    if selection.pivot is not None:
        toks = encoded.scoring_tokens
        doc["pivot"] = selection.pivot.tolist()
        doc["pivot_tokens"] = [toks[j] if j < len(toks) else None for j in doc["pivot"]]
    return json.dumps(doc, indent=indent)


__all__ = ["selection_to_json"]
