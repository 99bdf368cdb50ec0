"""A sweep shares the model with the page's views (`components/core/sweep_logic.run` on the engine's model
lock): every forward of the sweep runs while the sweep holds the model lock, a view asking for the
model meanwhile waits for the sweep's current call and never runs beside it, and between items the
sweep holds nothing.

Ordered by events, not by timing: the sweep's first forward stops until the view has either started to
wait for the lock (it is held) or entered the model itself (it is not: the two then overlap, which every
forward records). Each module's forward is instrumented by process-wide hooks, removed afterwards."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import torch

import mipruner
from components.core import sweep_logic as SL
from components.core.settings import Settings
from mipruner.testing import embedded_encoding

from ..conftest import ModelForwards, OwnedLock
from ..no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)

WAIT = 60  # s: a safety stop for a broken run only; the events decide the order


class Forwards(ModelForwards):
    """Every module forward in every thread: whether its thread held the lock, and whether another
    thread was inside a forward at the same time. The sweep's first forward waits for `moved`."""

    def __init__(self, model, lock: OwnedLock, sweep_thread: list, moved: threading.Event, inside: threading.Event):
        super().__init__(model)  # this model's modules only (not another test's)
        self.lock, self.sweep_thread, self.moved, self.inside = lock, sweep_thread, moved, inside
        self.unlocked, self.overlaps, self.sweep_calls, self.view_calls = 0, 0, 0, 0

    def seen(self, outer, others):
        me = threading.get_ident()
        self.overlaps += others
        if outer and self.lock.owner != me:
            self.unlocked += 1
        sweep = me in self.sweep_thread
        first = sweep and outer and self.sweep_calls == 0
        if outer:
            if sweep:
                self.sweep_calls += 1
            else:
                self.view_calls += 1
                self.moved.set()  # the view is inside the model
        return self.first if first else None

    def first(self):
        self.inside.set()
        assert self.moved.wait(WAIT)


def test_a_view_never_runs_beside_the_sweeps_model_call():
    a, _ = embedded_encoding()
    with SL.question_set("pope", 2, 1234) as (items, name):
        pass
    view_enc = a.encode(items[0].media, "Is there a circle?")
    sw = SL.make_sweep(["mi"], "budget", "4", 16, Settings().params, "question", 2)
    moved, inside = threading.Event(), threading.Event()
    lock = OwnedLock(waited=moved)  # the model lock, telling who holds it; `moved` set when an acquirer waits
    engine = SimpleNamespace(adapter=a, model_lock=lock, model_name="shapes-llava")
    sweep_thread: list[int] = []
    held_between_items: list[bool] = []
    events: list = []

    def sweep():
        sweep_thread.append(threading.get_ident())
        for ev in SL.run(SL.SweepState(), engine, sw, items, name, "lock-test"):
            held_between_items.append(lock.owner == threading.get_ident())
            events.append(ev)

    def view():
        with lock:
            out.append(mipruner.answer(a, view_enc, None, max_new_tokens=2))

    out: list = []
    with Forwards(a.model, lock, sweep_thread, moved, inside) as fw:
        t = threading.Thread(target=sweep, daemon=True)
        t.start()
        assert inside.wait(WAIT)  # the sweep is inside its first model call
        v = threading.Thread(target=view, daemon=True)
        v.start()
        v.join(WAIT)
        t.join(WAIT)
    assert not t.is_alive() and not v.is_alive() and out and events[-1][0] == "done"
    assert events[-1][1].n_items == 2
    assert fw.sweep_calls > 0 and fw.view_calls > 0
    assert fw.unlocked == 0, f"{fw.unlocked} forwards ran without their thread holding the model lock"
    assert fw.overlaps == 0, f"{fw.overlaps} forwards ran beside another thread's"
    assert held_between_items and not any(held_between_items)  # the lock is free between items
    with torch.no_grad():
        alone = mipruner.answer(a, view_enc, None, max_new_tokens=2)
    assert out[0].token_ids == alone.token_ids
