"""Suite-wide test settings.

MIPRUNER_TEST_DEVICE (default "cpu"): the device the pruner and method-contract tests put their
inputs and tiny models on, e.g. `MIPRUNER_TEST_DEVICE=cuda python3 -m pytest -q tests/pruners
tests/test_methods_contract.py tests/test_meta_device.py`, so the same tests prove a GPU. Tests
read it as `TEST_DEVICE` (module constant, for helpers) or the `device` fixture.

`compile_counter`: dynamo's CompileCounter as the compiled decode path's backend (`common/decode.COMPILE`), which
runs each captured graph eagerly and counts the graphs; dynamo reset before and after.

Shared by the lock tests (tests/test_warm_lock.py, tests/app/test_sweep_lock.py): `OwnedLock` (a lock that
knows its holder) and `ModelForwards` (every forward of one model, per thread, through removable hooks).
"""
from __future__ import annotations

import os
import threading

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


class OwnedLock:
    """A lock that knows which thread holds it (`owner`); `waited`, an Event or None, is set when an
    acquirer finds it held and has to wait."""

    def __init__(self, waited=None):
        self._lock, self.owner, self.waited = threading.Lock(), None, waited

    def __enter__(self):
        if not self._lock.acquire(blocking=False):
            if self.waited is not None:
                self.waited.set()
            self._lock.acquire()
        self.owner = threading.get_ident()
        return self

    def __exit__(self, *exc):
        self.owner = None
        self._lock.release()


class ModelForwards:
    """Every forward of `model`'s own modules (not another test's model), in every thread, through process-wide
    hooks registered on entering and removed on leaving: `seen(outer, others)` runs under a mutex at each one,
    `outer` when it is its thread's outermost forward (a module called inside another's forward is nested),
    `others` when another thread is inside a forward of the model at that moment; what `seen` returns (a
    callable or None) runs after it, outside the mutex (a wait on an event, say)."""

    def __init__(self, model):
        self.mine = {id(m) for m in model.modules()}
        self.depth: dict[int, int] = {}  # thread -> forwards it is inside
        self._mu = threading.Lock()

    def seen(self, outer: bool, others: bool):
        return None

    def pre(self, module, args):
        if id(module) not in self.mine:
            return
        me = threading.get_ident()
        with self._mu:
            others = any(d > 0 for t, d in self.depth.items() if t != me)
            self.depth[me] = self.depth.get(me, 0) + 1
            after = self.seen(self.depth[me] == 1, others)
        if after is not None:
            after()

    def post(self, module, args, out):
        if id(module) in self.mine:
            with self._mu:
                self.depth[threading.get_ident()] -= 1

    def __enter__(self):
        from torch.nn.modules import module as M

        self.handles = [M.register_module_forward_pre_hook(self.pre), M.register_module_forward_hook(self.post)]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()



@pytest.fixture()
def compile_counter(monkeypatch):
    """Dynamo's CompileCounter as the compiled decode path's backend: `frame_count` graphs captured, each run eagerly."""
    from torch._dynamo.testing import CompileCounter

    from mipruner.models.common import decode

    c = CompileCounter()
    monkeypatch.setitem(decode.COMPILE, "backend", c)
    torch._dynamo.reset()
    yield c
    torch._dynamo.reset()
