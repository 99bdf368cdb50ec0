"""Closing a streamed answer stops its decoding (issue 51, section 5): the reader yields at least every
HEARTBEAT_S, so a close() retried as a server retries it (Gradio's SyncToAsyncIterator.aclose: close() again
while "already executing") lands even while the answer waits for the model; the decoding then stops at its
next step. Checked by a counter of decoding steps, not by time."""
from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace

import pytest
import torch

from components.core import answers as A

WAIT = 30.0  # a bound for a stuck test, not a timing
SOON = 10.0  # the stream yields within this (HEARTBEAT_S is patched to 0.05 s): well under the model's WAIT
STEPS = 50


class SlowModel:
    """An engine whose one answer first waits for the model (`slot`), then decodes STEPS steps, each through the
    stream's logits processors; counts the steps it ran."""

    def __init__(self):
        self.slot, self.decoding, self.go = threading.Event(), threading.Event(), threading.Event()
        self.steps = 0
        self.stopped = threading.Event()
        self.adapter = SimpleNamespace(tokenizer=SimpleNamespace(decode=lambda ids, **_: " ".join(map(str, ids))))

    def generate(self, session, key, method, budget, params, max_new_tokens=8, logits_processor=()):
        assert self.slot.wait(WAIT)  # another visitor holds the model meanwhile: no report comes
        ids = torch.zeros(1, 3, dtype=torch.long)
        try:
            for _ in range(STEPS):
                for p in logits_processor:
                    p(ids, torch.zeros(1, 4))
                self.steps += 1
                if self.steps == 1:  # the first step is done: the next waits until the test lets it go
                    self.decoding.set()
                    assert self.go.wait(WAIT)
                ids = torch.cat([ids, torch.ones(1, 1, dtype=torch.long)], 1)
        except A.Stopped:
            self.stopped.set()
            raise
        raise AssertionError("the answer decoded to its end")


def close_as_a_server_does(gen, tries: int = 400) -> bool:
    """close() retried every 50 ms while the generator is executing (at most `tries` times)."""
    ev = threading.Event()
    for _ in range(tries):
        try:
            gen.close()
            return True
        except ValueError as e:
            assert "already executing" in str(e)
            ev.wait(0.05)
    return False


@pytest.mark.parametrize("stage", ["waiting for the model", "decoding"])
def test_closing_the_stream_stops_the_decoding(monkeypatch, stage):
    monkeypatch.setattr(A, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(A.TokensSoFar.__init__, "__defaults__", (3600.0,))  # no partial report while it decodes
    engine = SlowModel()
    gen = A.stream(engine, None, None, [], 4, {}, 8, guard=contextlib.nullcontext)
    between = threading.Event()  # the server's worker got a step and may close the stream now

    def read():  # the server's worker: one step of the stream
        next(gen)
        between.set()
    reader = threading.Thread(target=read, daemon=True)
    if stage == "decoding":
        engine.slot.set()
    reader.start()
    assert between.wait(SOON)  # a step came while the answer waits for the model, or decodes without a report
    assert engine.steps == (1 if stage == "decoding" else 0) and not engine.go.is_set()
    assert close_as_a_server_does(gen)  # the page went away
    reader.join(WAIT)
    engine.slot.set()  # the model frees up
    engine.go.set()
    assert engine.stopped.wait(WAIT)
    assert not reader.is_alive()
    assert engine.steps == (1 if stage == "decoding" else 0)  # not one step after the close
