"""Each family's tiny checkpoint for the tests, by config model_type (the rows of `mipruner.models.FAMILIES`):
`save_tiny(family, path)` writes a random-weight checkpoint of a few hundred kilobytes, offline, and returns
its folder. The configs live in the tiny_<line>.py modules beside this one; adding a family adds its line
to TINY (tests/models/test_family_contract.py checks that every row of the family table has one)."""
from __future__ import annotations

import os
from typing import Callable

from . import tiny_internvl, tiny_llava, tiny_onevision, tiny_qwen


def _qwen(kind: str) -> Callable[[str], str]:
    def save(path: str) -> str:  # tiny_qwen writes root/kind
        root, name = os.path.split(os.path.abspath(path))
        out = tiny_qwen.build(kind, root)
        if name != kind:
            os.replace(out, path)
            out = path
        return out
    return save


TINY: dict[str, Callable[[str], str]] = {
    "llava": lambda path: tiny_llava.save_tiny("llava", path),
    "llava_next": lambda path: tiny_llava.save_tiny("llava_next", path),
    "video_llava": lambda path: tiny_llava.save_tiny("video_llava", path),
    "llava_onevision": tiny_onevision.save_tiny,
    "internvl": tiny_internvl.save_tiny,
    "qwen2_vl": _qwen("qwen2_vl"),
    "qwen2_5_vl": _qwen("qwen2_5_vl"),
    "qwen3_vl": _qwen("qwen3_vl"),
}


def save_tiny(family: str, path: str) -> str:
    return TINY[family](path)
