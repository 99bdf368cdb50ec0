"""Module-scoped autouse fixtures that turn autograd off for a whole test module (one forward pass of a
tiny model after another): import the one a module needs into it (`from ..no_grad import no_grad`);
pytest registers it there, as if written in the module, under the name `_no_grad`."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True, name="_no_grad")
def no_grad():
    with torch.no_grad():
        yield


@pytest.fixture(scope="module", autouse=True, name="_no_grad")
def seeded_no_grad():
    """The same, with torch's global seed set to 0 first (modules whose tiny models or inputs draw from it)."""
    torch.manual_seed(0)
    with torch.no_grad():
        yield
