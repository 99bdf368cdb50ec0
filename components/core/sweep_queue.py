"""How much sweeping one visitor may ask of a shared server, without Gradio: the bound per call, the time
estimate from the model's measured speed, and the fair queue (one sweep per visitor, a place in line).

A sweep's size is counted in model steps: each item is encoded once per text mode and answered once
unpruned and once per method x value (x seed for Random). `Pace` keeps, per model and item kind (image,
video), the seconds one step took on this server's earlier sweeps; `SweepLimits.check` refuses, with a
sentence, a sweep above the step cap or whose estimate is above the time cap, and the running sweep stops
at that time cap (a partial result), so no call holds the sweep slot longer whatever the estimate said.
`SweepQueue` lets `slots` sweeps run at once; each visitor (browser session) holds at most one ticket,
running or waiting, and a waiting one is told its place. A user's zip waits as a `ZipSet` (checked, not
unpacked) and is unpacked by `opened` when its sweep starts.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

from mipruner.eval import sweep as sweeps

from .logic import UserError, user_errors

ITEMS = "Items"  # the Sweep area's label of the number of items (components/page/sweep.py)


@dataclass(frozen=True)
class SweepLimits:
    """Caps on one sweep call (None: no cap)."""

    max_items: int = 500
    max_steps: int | None = None
    max_seconds: float | None = None
    max_set_bytes: int = 2 << 30  # a zip's media, unpacked while the sweep runs
    max_waiting: int = 16  # sweeps waiting for a slot; more are refused

    @classmethod
    def for_server(cls, hosted: bool) -> "SweepLimits":
        """Hosted (a Space, a share link, a public address): small calls, five minutes at most each."""
        if hosted:
            return cls(max_items=100, max_steps=2000, max_seconds=300.0, max_set_bytes=200 << 20, max_waiting=8)
        return cls()

    def check(self, n_items: int, steps: int, estimate_s: float | None, *, counted: str = "") -> None:
        """UserError (one sentence) when a sweep of `n_items` items and `steps` model steps is too large here.
        counted: how `steps` was counted (`steps_line`), said in the sentence."""
        if n_items > self.max_items:
            raise UserError(f"{ITEMS}: this server sweeps at most {self.max_items} items per call, got {n_items}")
        if self.max_steps is not None and steps > self.max_steps:
            how = f" ({counted})" if counted else ""
            raise UserError(f"this sweep needs {steps:,} model steps{how}; this server runs at most "
                            f"{self.max_steps:,} per call: use fewer items, methods or values")
        if self.max_seconds is not None and estimate_s is not None and estimate_s > self.max_seconds:
            raise UserError(f"this sweep would take about {minutes(estimate_s)} at this model's measured speed; "
                            f"this server runs at most {minutes(self.max_seconds)} per call: use fewer items, "
                            "methods or values")


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def step_terms(sw) -> tuple[int, int]:
    """(encodings, pruned answers) of sweep `sw` per item; with the one unpruned answer, an item's steps."""
    pruned = sum(len(sw.values if sw.varies(m) else sw.values[:1]) * len(sw.seeds_of(m)) for m in sw.methods)
    return (len(sw.values) if sw.param == "text_mode" else 1), pruned  # one encoding per text mode


def steps_of(sw, n_items: int) -> int:
    """Model steps of sweep `sw` over `n_items` items: encodings plus answers (an upper bound: equal
    selections share one answer)."""
    encodings, pruned = step_terms(sw)
    return n_items * (encodings + 1 + pruned)


def steps_line(sw, n_items: int) -> str:
    """How `steps_of` counts, in words whose figures multiply to it: "100 items x (1 encoding + 1 unpruned
    answer + 25 pruned answers: methods x values, x 3 seeds for Random)"."""
    encodings, pruned = step_terms(sw)
    seeded = [m for m in sw.methods if len(sw.seeds_of(m)) > 1]
    seeds = f", x {len(sw.seeds_of(seeded[0]))} seeds for {', '.join(seeded)}" if seeded else ""
    return (f"{n_items:,} item{'s' * (n_items != 1)} x ({encodings} encoding{'s' * (encodings != 1)} + 1 unpruned "
            f"answer + {pruned} pruned answer{'s' * (pruned != 1)}: methods x values{seeds})")


class Pace:
    """Seconds per model step, per model and per item kind ("image", "video": `sweeps.media_kind`), measured on
    this server's sweeps (a running mean over the last ones: each finished item adds its own time over its
    steps to its kind's mean). A sweep of slow clips leaves the images' pace as it was."""

    def __init__(self, weight: float = 0.2):
        self.weight = weight
        self._s: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def observe(self, model: str, seconds: float, steps: int, kind: str = "image") -> None:
        if steps <= 0 or seconds < 0:
            return
        per = seconds / steps
        with self._lock:
            old = self._s.get((model, kind))
            self._s[(model, kind)] = per if old is None else old + self.weight * (per - old)

    def per_step(self, model: str, kind: str = "image") -> float | None:
        with self._lock:
            return self._s.get((model, kind))

    def estimate(self, model: str, steps: int, kind: str = "image") -> float | None:
        per = self.per_step(model, kind)
        return None if per is None else per * steps

    def estimate_items(self, model: str, steps_per_item: int, kinds) -> float | None:
        """Seconds for items of these kinds (one per item), `steps_per_item` model steps each; None while a kind
        among them has no measured pace yet (then only the step cap applies, and the time cap stops the sweep)."""
        total = 0.0
        for kind, n in Counter(kinds).items():
            est = self.estimate(model, steps_per_item * n, kind)
            if est is None:
                return None
            total += est
        return total


class SweepQueue:
    """Sweeps in arrival order, `slots` at a time; one ticket per visitor, `max_waiting` waiting at most."""

    def __init__(self, slots: int = 1, max_waiting: int = 16):
        self.slots, self.max_waiting = slots, max_waiting
        self._waiting: deque[str] = deque()
        self._running: set[str] = set()
        self._cv = threading.Condition()

    def join(self, visitor: str) -> None:
        with self._cv:
            if visitor in self._running or visitor in self._waiting:
                raise UserError("you have a sweep running or waiting already: each visitor runs one sweep at a "
                                "time (cancel it, or wait for its result)")
            if len(self._waiting) >= self.max_waiting:
                raise UserError(f"the sweep queue is full ({len(self._waiting)} waiting): try again in a few minutes")
            self._waiting.append(visitor)

    def place(self, visitor: str) -> int:
        """1 for the next to run, 0 when running (or not queued)."""
        with self._cv:
            return self._waiting.index(visitor) + 1 if visitor in self._waiting else 0

    def wait(self, visitor: str, poll_s: float = 1.0, gone=None):
        """Yield the visitor's place (1 = next) while it waits, at most every `poll_s` seconds; return once
        its sweep may run. gone() -> True (the visitor cancelled) leaves the queue and returns False."""
        last = None
        while True:
            with self._cv:
                if self._waiting and self._waiting[0] == visitor and len(self._running) < self.slots:
                    self._waiting.popleft()
                    self._running.add(visitor)
                    self._cv.notify_all()
                    return True
                place = self._waiting.index(visitor) + 1
            if gone is not None and gone():
                self.leave(visitor)
                return False
            if place != last:
                last = place
                yield place
            with self._cv:
                self._cv.wait(poll_s)

    def leave(self, visitor: str) -> None:
        with self._cv:
            self._running.discard(visitor)
            if visitor in self._waiting:
                self._waiting.remove(visitor)
            self._cv.notify_all()

    @property
    def waiting(self) -> int:
        with self._cv:
            return len(self._waiting)


@dataclass(frozen=True)
class ZipSet:
    """A user's zip set checked but not unpacked: its size (bytes its media unpack to) and each item's media kind.
    `len` is its item count; `opened` unpacks it."""

    zip_path: str
    questions: str | None
    n: int
    size: int
    kinds: tuple
    limits: SweepLimits
    files: object = None  # the app's FileBudget, which the unpacked media count under

    def __len__(self) -> int:
        return len(self.kinds)

    @contextlib.contextmanager
    def held(self):
        """The media's bytes held under the caps for the block (UserError, one sentence, when they do not fit)."""
        if self.size > self.limits.max_set_bytes:
            raise UserError(f"zip: its media unpack to {self.size / (1 << 20):,.0f} MiB; this server unpacks at "
                            f"most {self.limits.max_set_bytes >> 20} MiB per sweep (use fewer or smaller files)")
        with contextlib.ExitStack() as stack:
            if self.files is not None:
                try:
                    stack.enter_context(self.files.hold(self.size))
                except ValueError:
                    raise UserError(f"zip: its media ({self.size / (1 << 20):,.0f} MiB) do not fit in this server's "
                                    "space for files now: try a smaller set, or again later") from None
            yield


@contextlib.contextmanager
def opened(items):
    """The items of a set for the block: a `ZipSet` unpacked (into a `mipruner-set-*` folder that counts under the
    app's FileBudget while it exists and is removed when the block ends, whatever happened in it); a list as is."""
    if not isinstance(items, ZipSet):
        yield items
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(items.held())
        with user_errors("reading the question set", "use a smaller set"):
            got = stack.enter_context(sweeps.unpacked_set(items.zip_path, items.questions, n=items.n,
                                                          max_bytes=items.limits.max_set_bytes))
        yield got


def kinds_of(items) -> list[str]:
    """Each item's media kind (`sweeps.media_kind`), read without unpacking a zip set."""
    return list(items.kinds) if isinstance(items, ZipSet) else [sweeps.media_kind(getattr(it, "media", None))
                                                                 for it in items]


class Deadline:
    """should_stop for a sweep: the visitor's Cancel, or the time cap passed (then `expired` is True)."""

    def __init__(self, stop: threading.Event, max_seconds: float | None, clock=time.monotonic):
        self.stop, self.clock = stop, clock
        self.end = None if max_seconds is None else clock() + max_seconds
        self.expired = False

    def __call__(self) -> bool:
        if self.end is not None and self.clock() > self.end:
            self.expired = True
        return self.expired or self.stop.is_set()


__all__ = ["ITEMS", "Deadline", "Pace", "SweepLimits", "SweepQueue", "ZipSet", "kinds_of", "minutes", "opened", "step_terms",
           "steps_line", "steps_of"]
