"""Suite-wide test settings.

MIPRUNER_TEST_DEVICE (default "cpu"): the device the pruner and method-contract tests put their
inputs and tiny models on, e.g. `MIPRUNER_TEST_DEVICE=cuda python3 -m pytest -q tests/pruners
tests/test_methods_contract.py tests/test_meta_device.py`, so the same tests prove a GPU. Tests
read it as `TEST_DEVICE` (module constant, for helpers) or the `device` fixture.
"""
from __future__ import annotations

import os

import pytest
import torch

TEST_DEVICE = torch.device(os.environ.get("MIPRUNER_TEST_DEVICE", "cpu") or "cpu")


def pytest_configure(config):
    if TEST_DEVICE.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"MIPRUNER_TEST_DEVICE={TEST_DEVICE} but torch sees no CUDA device")


def pytest_report_header(config):
    return f"mipruner test device: {TEST_DEVICE} (MIPRUNER_TEST_DEVICE)"


@pytest.fixture
def device() -> torch.device:
    return TEST_DEVICE


def raising_method(name: str, message: str):
    """A module fixture's body: register method `name`, which raises RuntimeError(message) on every input,
    yield its name, then remove it (the tests of "a broken method costs its own panel / rows")."""
    from mipruner.pruners import register_pruner, unregister_pruner

    @register_pruner(name, label="Boom")
    def method(visual, text, budget):
        """Raises on every input."""
        raise RuntimeError(message)

    yield name
    unregister_pruner(name)
