"""The encoded sessions the app keeps itself, by Gradio's session hash.

Gradio holds each browser session's `gr.State` in one LRU of `state_session_capacity` sessions, and every call
of a new session (even one that reads nothing, such as /settings) takes a place in it: a flood of throw-away
sessions pushes out the state of a visitor who encoded, whose next view then says "run the model first".
`Kept` is the app's own record of the sessions that did encode, bounded by count and idle age: a session that
never encoded takes no place in it and so evicts nobody; a state Gradio dropped is found again by the session's
hash. What a kept state holds (its encodings) stays under the app's byte cap (`mipruner.serve.session.CacheBudget`),
as it did in Gradio's store.

The hash is Gradio's own key for the session's state: knowing it reads no more here than it does there.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from .logic import UIState


def encoded(state: Any) -> bool:
    """Whether `state` is a session's state with an encoding on screen."""
    return isinstance(state, UIState) and state.key is not None


class Kept:
    """session hash -> UIState for at most `capacity` encoded sessions, each dropped after `ttl_s` without use;
    the least recently used goes first. Thread-safe (Gradio runs events in a thread pool)."""

    def __init__(self, capacity: int = 1000, ttl_s: float = 1800, clock: Callable[[], float] = time.monotonic):
        if capacity < 1:
            raise ValueError(f"the kept sessions' capacity must be at least 1, got {capacity}")
        self.capacity, self.ttl_s, self._clock = int(capacity), float(ttl_s), clock
        self._states: OrderedDict[str, tuple[UIState, float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._states)

    def keep(self, session: str | None, state: Any) -> None:
        """Note that `session` holds `state` now (only an encoded state, of a session with a hash)."""
        if not session or not encoded(state):
            return
        with self._lock:
            self._states[session] = (state, self._clock())
            self._states.move_to_end(session)
            self._expire()
            while len(self._states) > self.capacity:
                self._states.popitem(last=False)

    def state(self, session: str | None, state: Any) -> Any:
        """`state` as the call brought it, or, when it brings no encoded state (Gradio dropped it), the one this
        session last kept; the session's use is noted either way."""
        if encoded(state) or not session:
            self.keep(session, state)
            return state
        with self._lock:
            self._expire()
            hit = self._states.get(session)
            if hit is None:
                return state
            self._states[session] = (hit[0], self._clock())
            self._states.move_to_end(session)
            return hit[0]

    def _expire(self) -> None:
        """Drop the sessions idle for longer than ttl_s (the oldest first; under the lock)."""
        now = self._clock()
        while self._states:
            session, (_, used) = next(iter(self._states.items()))
            if now - used <= self.ttl_s:
                return
            del self._states[session]


def kept_in(outputs: Any) -> UIState | None:
    """The encoded state among an event's outputs (a tuple whose items may include the session's state)."""
    if encoded(outputs):
        return outputs
    if isinstance(outputs, (tuple, list)):
        return next((o for o in outputs if encoded(o)), None)
    return None


__all__ = ["Kept", "encoded", "kept_in"]
