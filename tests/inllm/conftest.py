"""Fixtures the in-LLM API tests share: the embedded model's encoding, and names registered during a test."""
from __future__ import annotations

import pytest
import torch

from mipruner.pruners import unregister_pruner
from mipruner.testing import embedded_encoding


@pytest.fixture(scope="module")
def model():
    """The embedded model's (adapter, encoding), autograd off, one per module."""
    with torch.no_grad():
        yield embedded_encoding()


@pytest.fixture
def registered():
    """A list a test appends the names it registers to; each is unregistered after the test."""
    names = []
    yield names
    for n in names:
        unregister_pruner(n)
