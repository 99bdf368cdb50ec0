"""The warm-up holds the model's lock around every forward pass it runs (issue 51, section 5): visitors'
requests meanwhile wait for a batch to finish instead of running beside it. A lock that records its owner
and forward hooks on every module of the model (tests/conftest.py's `OwnedLock`, `ModelForwards`; removed
afterwards) count the forwards run without it."""
from __future__ import annotations

import threading

from mipruner.testing import embedded_encoding
from mipruner.serve.turns import Turns
from mipruner.serve.warm_up import warm_up

from .conftest import ModelForwards, OwnedLock
from .no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)


class Forwards(ModelForwards):
    """Counts forwards of `model`'s modules (outermost calls only) with and without `held()`."""

    def __init__(self, model, held):
        super().__init__(model)
        self.held, self.locked, self.unlocked = held, 0, 0

    def seen(self, outer, others):
        if outer:
            if self.held():
                self.locked += 1
            else:
                self.unlocked += 1


def run_warm_up(lock, held):
    a, enc = embedded_encoding()
    calls = []
    with Forwards(a.model, held) as fw:
        n = warm_up(a, lock, enc.frames[0], "Is there a circle?", ["mi", "random"], 0.25, 2,
                    on_batch=lambda i, total, what: calls.append(what))
    return n, calls, fw


def test_every_forward_of_the_warm_up_holds_the_lock():
    lock = OwnedLock()
    n, calls, fw = run_warm_up(lock, lambda: lock.owner == threading.get_ident())
    assert n == len(calls) == 3  # the plain path: the default view, a slider move, one unpruned answer
    assert fw.unlocked == 0 and fw.locked >= n + 1  # an encoding and every batch, each under the lock


def test_the_warm_up_takes_its_turns_on_the_engines_slot():
    turns = Turns()
    n, _, fw = run_warm_up(turns, turns.locked)
    assert fw.unlocked == 0 and turns.granted >= n + 1 and not turns.locked()
    assert set(turns.history) == {None}  # no session's turns: the warm-up's own
