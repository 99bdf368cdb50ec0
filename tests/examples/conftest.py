"""Fixtures for the example plug-ins under examples/: each imported from its source folder (its
method registers), then unregistered, so the rest of the suite sees the registry it expects."""
from __future__ import annotations

import importlib
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _plugin(folder: str, module: str, name: str):
    from mipruner.pruners import list_pruners, unregister_pruner

    path = os.path.join(ROOT, "examples", folder)
    sys.path.insert(0, path)
    try:
        mod = importlib.import_module(module)
        assert name in list_pruners()
        yield mod
    finally:
        if name in list_pruners():
            unregister_pruner(name)
        for m in [m for m in sys.modules if m.split(".")[0] == module.split(".")[0]]:
            del sys.modules[m]
        sys.path.remove(path)


@pytest.fixture(scope="module")
def pyramiddrop():
    yield from _plugin("pyramiddrop", "mipruner_pyramiddrop.pyramiddrop", "pyramiddrop")


@pytest.fixture(scope="module")
def prumerge():
    yield from _plugin("prumerge", "mipruner_prumerge.prumerge", "prumerge")
