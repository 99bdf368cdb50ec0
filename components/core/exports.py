"""An export of one view as files (the page's Downloads): PNG of every panel image, JSON of every selection
and the view's raw data."""
from __future__ import annotations

import json
import os

from mipruner.serve.export import selection_to_json


def write_export(views, summary: dict, encoded, out_dir: str) -> list[str]:
    """The files of `views` (a failed method's sentence is in view.json only) under out_dir; their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for v in views:
        if v.error is not None:  # view.json carries its sentence
            continue
        for what, img in (("mask", v.mask), ("heatmap", v.heatmap), ("pivots", v.pivot)):
            if img is not None:
                p = os.path.join(out_dir, f"{v.method}_{what}.png")
                img.save(p)
                paths.append(p)
        p = os.path.join(out_dir, f"{v.method}_selection.json")
        with open(p, "w") as f:
            f.write(selection_to_json(encoded, v.selection))
        paths.append(p)
    p = os.path.join(out_dir, "view.json")
    with open(p, "w") as f:
        json.dump(summary, f)
    paths.append(p)
    return paths


__all__ = ["write_export"]
