"""How many new browser sessions one address may open: a token bucket per address (`NewSessions`).

Every call that brings a session hash Gradio has not seen makes Gradio build that session's state: a copy of
the page's configuration, about 0.4 MB and 20 ms of CPU on this page, held until `--max-sessions` newer ones
push it out. A client that sends each call under a new hash (600 throw-away /settings calls) costs the server
seconds of CPU and hundreds of MB, and slows every other visitor's Run. Here each address (on a Space, the one
its proxy forwards) may bring `burst` new sessions at once and `per_minute` more each minute; a call of a
session already seen always passes, so a visitor whose address is out of new sessions keeps working in the
one it has. `components.hosting.uploads.BodyCap` asks before the call reaches Gradio (HTTP 429 and a sentence).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable

TOO_MANY_SESSIONS = ("This address opened too many new sessions in a short time (at most {burst}, then {rate:g} a "
                     "minute): wait a minute, or go on in a page already open.")


class NewSessions:
    """Per address, `burst` new session hashes at once and `per_minute` more a minute; the last `remember` hashes
    seen pass without counting. per_minute 0: no bound."""

    def __init__(self, per_minute: float = 20, burst: int | None = None, remember: int = 20_000,
                 clock: Callable[[], float] = time.monotonic):
        self.per_minute = float(per_minute)
        self.burst = int(burst if burst is not None else max(1, per_minute))
        self.remember, self._clock = int(remember), clock
        self._known: OrderedDict[str, None] = OrderedDict()
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, when counted)
        self._lock = threading.Lock()

    @property
    def sentence(self) -> str:
        return TOO_MANY_SESSIONS.format(burst=self.burst, rate=self.per_minute)

    def admit(self, address: str, session: str | None) -> bool:
        """Whether a call of `session` (None: a call that gets a new session of its own) from `address` may pass."""
        if self.per_minute <= 0:
            return True
        with self._lock:
            if session is not None and session in self._known:
                self._known.move_to_end(session)
                return True
            now = self._clock()
            tokens, then = self._buckets.get(address, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) * self.per_minute / 60.0)
            if tokens < 1.0:
                self._buckets[address] = (tokens, now)
                return False
            self._buckets[address] = (tokens - 1.0, now)
            if session is not None:
                self._known[session] = None
                while len(self._known) > self.remember:
                    self._known.popitem(last=False)
            if len(self._buckets) > self.remember:  # forget the addresses whose buckets have refilled
                full = 60.0 * self.burst / self.per_minute
                self._buckets = {a: b for a, b in self._buckets.items() if now - b[1] < full}
            return True


__all__ = ["TOO_MANY_SESSIONS", "NewSessions"]
