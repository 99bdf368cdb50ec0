"""The shared model's one slot, taken in turns between sessions (a round-robin lock), with a cap on what one
session may have waiting.

A plain lock lets whoever asked first go first: one visitor who queues 40 encodes makes every other visitor
wait for all 40. `Turns` keeps one line per owner (a browser session; `None` for work of no session: the
warm-up, a sweep's item) and, each time the slot frees, hands it to the next owner in a ring, so a visitor
with one request waits for the request under way and at most one request of each other owner that was waiting
before it, however many those owners queued. Within one owner, requests keep their order. An owner asking for more than
`max_waiting` waiting requests is refused at once with a sentence (`Busy`, a ValueError: the app shows it
as the request's error).

Who an owner is: the session the engine is asked for, or, within `visitor(name)`, that name (the app names
each call by its browser connection, so the calls of one client share one line however many sessions they
make). `with turns:` takes a turn as the anonymous owner (a drop-in for a `threading.Lock`: the sweeps and the
warm-up hold it around each call into the model); `with turns.turn(owner):` as `owner`. Not re-entrant,
as a `threading.Lock` is not. `granted` counts the turns handed out, `history` keeps the owners of the
last ones (oldest first, `label`: a session by its id) and `waited` how many turns went to others while each
waited, so tests assert turns by order, never by time.
"""
from __future__ import annotations

import contextlib
import threading
from collections import deque
from contextvars import ContextVar

HISTORY = 256  # owners of the last turns kept in `history`
_VISITOR: ContextVar = ContextVar("mipruner_visitor", default=None)


_IN_FLIGHT: dict[str, int] = {}  # visitor -> its calls under way (`visitor(..., max_calls=)`)
_IN_FLIGHT_LOCK = threading.Lock()


@contextlib.contextmanager
def visitor(name: str | None, max_calls: int | None = None):
    """Within the block, `turn(owner)` takes its turn as `name` (a browser connection's id) instead of `owner`:
    the calls of one visitor whose sessions differ (an API client's first calls, each with no state yet, each
    get a new session) share one line and one cap. None or "": the owner as given. max_calls: Busy at once when
    `name` has that many calls under way already (counted from the block's start, so a flooder's surplus is
    refused before it does any work and the server's workers go on to other visitors)."""
    name = name or None
    if name is not None and max_calls is not None:
        with _IN_FLIGHT_LOCK:
            n = _IN_FLIGHT.get(name, 0)
            if n >= max_calls:
                raise Busy(f"this session has {n} requests under way already: wait for them to finish, then ask "
                           "again")
            _IN_FLIGHT[name] = n + 1
    token = _VISITOR.set(name)
    try:
        yield
    finally:
        _VISITOR.reset(token)
        if name is not None and max_calls is not None:
            with _IN_FLIGHT_LOCK:
                _IN_FLIGHT[name] -= 1
                if not _IN_FLIGHT[name]:
                    del _IN_FLIGHT[name]


def label(owner):
    """What `history` keeps of an owner: a name (str) or None as it is, any other object by its id (the history
    holds no session alive)."""
    return owner if owner is None or isinstance(owner, str) else id(owner)


class _Ticket:
    """One waiting request: who asked, and when (in turns handed out); compared by identity."""

    __slots__ = ("who", "asked")

    def __init__(self, who, asked: int):
        self.who, self.asked = who, asked


class Busy(ValueError):
    """An owner already has its cap of requests waiting for the model."""


class Turns:
    """Round-robin over owners for one slot. max_waiting: requests one owner may have waiting (not counting the
    one it holds); None: no cap (the anonymous owner is never capped: its callers bound themselves)."""

    def __init__(self, max_waiting: int | None = None):
        self.max_waiting = max_waiting
        self._cv = threading.Condition(threading.Lock())
        self._held = False
        self._lines: dict[object, deque] = {}  # owner key -> its waiting tickets, first first
        self._ring: deque = deque()  # owners with a waiting ticket, the next to go first
        self._labels: dict[object, object] = {}  # owner key -> its `label`, while it has a line
        self._granted: object | None = None  # the ticket the slot was handed to, until its thread takes it
        self.granted = 0
        self.history: deque = deque(maxlen=HISTORY)
        self.waited: deque = deque(maxlen=HISTORY)  # (owner's label, turns others took while it waited) per turn

    @staticmethod
    def _key(owner):
        """An owner's line: a name (str) by its value (two requests of one connection carry equal names, not
        one object), None as the anonymous owner, any other object (a session) by its identity: its `label`."""
        return label(owner)

    def waiting(self, owner=None) -> int:
        """Requests of `owner` waiting for the slot now."""
        with self._cv:
            return len(self._lines.get(self._key(owner), ()))

    def waiting_by_owner(self) -> dict:
        """{owner's `label`: its requests waiting} for every owner with one waiting now."""
        with self._cv:
            return {self._labels[k]: len(line) for k, line in self._lines.items()}

    def locked(self) -> bool:
        with self._cv:
            return self._held

    def acquire(self, owner=None) -> bool:
        """Wait for `owner`'s turn and take the slot; Busy when `owner` has `max_waiting` waiting already."""
        key = self._key(owner)
        with self._cv:
            if not self._held and not self._ring:
                self._held = True
                self._count(label(owner), self.granted)
                return True
            line = self._lines.get(key)
            if owner is not None and self.max_waiting is not None and line is not None \
                    and len(line) >= self.max_waiting:
                raise Busy(f"this session has {len(line)} requests waiting for the model already: wait for them "
                           "to finish, then ask again")
            ticket = _Ticket(label(owner), self.granted)
            if line is None:
                line = self._lines[key] = deque()
                self._ring.append(key)
                self._labels[key] = label(owner)
            line.append(ticket)
            try:
                while self._granted is not ticket:
                    self._cv.wait()
            except BaseException:  # interrupted while waiting: leave the line (or pass on a turn just handed over)
                if self._granted is ticket:
                    self._granted = None
                    self._held = False
                    self._next()
                else:
                    self._drop(key, ticket)
                raise
            self._granted = None  # the slot was handed over (and counted) in `_next`
            return True

    def _count(self, who, asked: int) -> None:
        self.waited.append((who, self.granted - asked))
        self.granted += 1
        self.history.append(who)

    def _drop(self, key, ticket) -> None:
        line = self._lines.get(key)
        if line is None:
            return
        line.remove(ticket)
        if not line:
            del self._lines[key], self._labels[key]
            self._ring.remove(key)

    def _next(self) -> None:
        """Hand the free slot to the first ticket of the next owner in the ring (who goes to the ring's end
        when it has more waiting)."""
        if not self._ring:
            return
        key = self._ring.popleft()
        line = self._lines[key]
        self._granted = line.popleft()
        self._held = True
        self._count(self._granted.who, self._granted.asked)
        if line:
            self._ring.append(key)
        else:
            del self._lines[key], self._labels[key]
        self._cv.notify_all()

    def release(self) -> None:
        with self._cv:
            if not self._held or self._granted is not None:
                raise RuntimeError("release of a model slot that is not held")
            self._held = False
            self._next()

    def turn(self, owner=None) -> "Turn":
        """A context manager (reusable) that holds the slot as `owner`, or as the `visitor` of the block it
        is entered in."""
        return Turn(self, owner)

    def __enter__(self):
        self.acquire(None)
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class Turn:
    """`with turns.turn(owner):` holds the slot as `owner` for the block."""

    def __init__(self, turns: Turns, owner):
        self.turns, self.owner = turns, owner

    def __enter__(self):
        name = _VISITOR.get()
        self.turns.acquire(self.owner if name is None else name)
        return self

    def __exit__(self, *exc) -> None:
        self.turns.release()


__all__ = ["Busy", "Turn", "Turns", "label", "visitor"]
