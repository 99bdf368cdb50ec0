"""Per-browser-session state: an LRU of encodings, keyed by what they are of (media content hash,
prompt, text mode, model). Sessions share no mutable state; the engine holds none per user.

Memory stays bounded however many sessions come and go: each session keeps a few encodings
(count and idle age), and one `CacheBudget` caps the bytes of every session's cached encodings
together, dropping the least recently used first, whichever session holds it. What an entry holds is
all of it: the encoding (its decoded frames, recorded attention and blocks), the selection cache, the
picture the panels reuse, the drawn maps and the answers (`nbytes` walks them all). Bytes dropped go
back to the operating system (`release`), not only to the allocator's free lists: a server's threads
otherwise keep them in their malloc arenas and its RSS climbs past the cap. `FileBudget` does the
same for files the app writes (rendered panels, exports) on disk.
"""
from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from .. import viz
from ..media import media_hash  # noqa: F401 - the one media hasher (the lmms answer cache uses it too)
from .files import FileBudget  # noqa: F401 - its home was this module
from .holdings import Release, model_storages, nbytes


class EncodingKey(NamedTuple):
    """What one cached encoding is of. `media` is a sha256 of the media's content."""

    model: str
    media: str
    prompt: str
    text_mode: str
    need_attention: bool
    views: str = "all"  # "all" or "base" (an anyres image read as its base view only): different encodings


class StaleKeyError(LookupError):
    """The key names no encoding of this session (never encoded, evicted or expired)."""


@dataclass
class CachedEncoding:
    """One encoding and what was derived from it in this session."""

    encoded: Any  # mipruner.models.Encoded
    mi_cache: dict = field(default_factory=dict)  # the `cache=` of mipruner.select for this encoding
    layout: viz.Layout | None = None
    answers: dict = field(default_factory=dict)  # answer key -> Answer
    drawings: dict = field(default_factory=dict)  # what `drawn` made: key -> (values, drawing)
    last_used: float = 0.0
    source: tuple | None = field(default=None, repr=False)  # (media, prompt, text_mode, views): re-encode with more signals
    refused: set = field(default_factory=set, repr=False)  # Signals the model could not give (not asked again)

    def drawn(self, key, values, draw: Callable[[], Any]):
        """`draw()`, or the drawing made last under `key` when it was drawn from equal `values`.

        A budget move changes the kept mask only: a method's heatmap and pivot map follow its
        scores, which stay the same, so the same image objects go back to the page (which then
        re-encodes and re-fetches nothing). One drawing per key: memory stays one per panel."""
        import torch

        hit = self.drawings.get(key)
        if hit is not None and hit[0].shape == values.shape and hit[0].dtype == values.dtype \
                and hit[0].device == values.device and torch.equal(hit[0], values):
            return hit[1]
        out = draw()
        self.drawings[key] = (values, out)
        return out


_uids = itertools.count(1)


@dataclass(eq=False)
class Session:
    """Per-browser-session state: an LRU of encodings. Never shared between sessions.

    max_entries: encodings kept (each holds N_V x d floats and their PMI caches);
    max_age_s: an encoding unused for this long is dropped;
    budget: the byte cap shared with other sessions (it may drop this session's entries).

    Its own bookkeeping: `find` / `get` (expire, then mark an entry used: last in the LRU, its
    idle clock reset, the byte cap told), `put` a new encoding, `charge` an entry's size to the cap.
    """

    max_entries: int = 3  # a handful of images per user; each is ~10 MB at 576 x 4096 fp32
    max_age_s: float = 1800.0  # 30 min idle: a user who walked away frees their memory
    entries: OrderedDict = field(default_factory=OrderedDict, repr=False)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)
    budget: "CacheBudget | None" = field(default=None, repr=False, compare=False)
    uid: int = field(default_factory=lambda: next(_uids), compare=False)

    def __post_init__(self):
        if not (isinstance(self.max_entries, int) and self.max_entries >= 1):
            raise ValueError(f"max_entries must be an int >= 1, got {self.max_entries!r}")
        if not self.max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0, got {self.max_age_s!r}")

    def keys(self) -> list[EncodingKey]:
        return list(self.entries)

    def __getstate__(self) -> dict:
        """Pickled without its lock and byte cap (ZeroGPU hands a session to a worker process and back:
        the process that keeps it re-attaches the cap, `ModelService.adopt`)."""
        state = dict(self.__dict__)
        state.pop("lock", None)
        state["budget"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock = threading.RLock()

    def find(self, keys, now: float) -> EncodingKey | None:
        """The first of `keys` this session holds (after dropping what expired by `now`), marked used."""
        with self.lock:
            self.expire(now)
            for k in keys:
                if k in self.entries:
                    self._use(k, now)
                    return k
        return None

    def get(self, key: EncodingKey, now: float) -> CachedEncoding:
        """The entry for `key`, marked used; StaleKeyError when it was evicted, expired or never made."""
        with self.lock:
            if self.find((key,), now) is None:
                raise StaleKeyError("this encoding is no longer cached (expired or evicted): encode again")
            return self.entries[key]

    def put(self, key: EncodingKey, encoded: Any, now: float) -> CachedEncoding:
        """Cache a new encoding under `key` as the most recently used (the oldest may go)."""
        with self.lock:
            e = self.entries[key] = CachedEncoding(encoded=encoded, last_used=now)
            self.entries.move_to_end(key)
            self.expire(now)
        return e

    def charge(self, key: EncodingKey, size: int) -> None:
        """Report entry `key`'s size to the byte cap (which may drop other entries)."""
        if self.budget is not None:
            self.budget.charge(self, key, size)

    def _use(self, key: EncodingKey, now: float) -> None:
        self.entries.move_to_end(key)
        self.entries[key].last_used = now
        if self.budget is not None:
            self.budget.touch(self, key)

    def expire(self, now: float) -> None:
        with self.lock:
            for k in [k for k, e in self.entries.items() if now - e.last_used > self.max_age_s]:
                self.drop(k)
            while len(self.entries) > self.max_entries:
                self.drop(next(iter(self.entries)))  # least recently used first

    def drop(self, key: EncodingKey) -> None:
        with self.lock:
            self.entries.pop(key, None)
        if self.budget is not None:
            self.budget.forget(self, key)


class CacheBudget:
    """One byte cap over the cached encodings of ALL sessions: least recently used first.

    The engine reports each entry's size (`charge`) when it is made or grows, and each use
    (`touch`); past `max_bytes` the least recently used entries of any session are dropped (a
    session busy in another thread is skipped, the entry being charged is never dropped). Sessions
    are held weakly: a session the app forgets takes its entries out of the count.
    """

    def __init__(self, max_bytes: int, release: Release | None = None):
        if not max_bytes > 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes!r}")
        self.max_bytes = int(max_bytes)
        self.release = release if release is not None else Release()  # dropped bytes back to the OS
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[int, EncodingKey], int] = OrderedDict()
        self._sessions: dict[int, weakref.ref] = {}
        self._dead: deque[int] = deque()
        self.total_bytes = 0
        self.evicted = 0  # entries dropped to stay under the cap, since start
        self._freed = False  # entries went since the last release (eviction, expiry, a session forgotten)

    def __len__(self) -> int:
        with self._lock:
            self._purge()
            return len(self._items)

    def _purge(self) -> None:
        while self._dead:
            uid = self._dead.popleft()
            self._sessions.pop(uid, None)
            for item in [i for i in self._items if i[0] == uid]:
                self.total_bytes -= self._items.pop(item)
                self._freed = True

    def size_of(self, session: Session, key: EncodingKey) -> int:
        """The bytes charged for `session`'s entry `key` (0: none)."""
        with self._lock:
            return self._items.get((session.uid, key), 0)

    def touch(self, session: Session, key: EncodingKey) -> None:
        with self._lock:
            if (session.uid, key) in self._items:
                self._items.move_to_end((session.uid, key))

    def forget(self, session: Session, key: EncodingKey) -> None:
        with self._lock:
            if (session.uid, key) in self._items:
                self.total_bytes -= self._items.pop((session.uid, key))
                self._freed = True  # released at the next charge, outside every lock

    def charge(self, session: Session, key: EncodingKey, size: int) -> int:
        """Record the entry's size (most recently used now) and drop others past the cap; returns
        how many entries were dropped. Memory of entries dropped since the last charge (here, by expiry
        or with a forgotten session) goes back to the operating system (`release`), outside the locks."""
        dropped = self._charge(session, key, size)
        with self._lock:
            freed, self._freed = self._freed, False
        if freed and not self.release() and not self.release.defer:
            with self._lock:
                self._freed = True  # released too recently and not put off: at a later charge
        return dropped

    def _charge(self, session: Session, key: EncodingKey, size: int) -> int:
        item = (session.uid, key)
        with self._lock:
            self._purge()
            if session.uid not in self._sessions:
                self._sessions[session.uid] = weakref.ref(session, lambda _, uid=session.uid: self._dead.append(uid))
            self.total_bytes += int(size) - self._items.pop(item, 0)
            self._items[item] = int(size)
            dropped = 0
            for victim in list(self._items):
                if self.total_bytes <= self.max_bytes:
                    break
                if victim == item:
                    continue
                owner = self._sessions.get(victim[0])
                owner = owner() if owner is not None else None
                if owner is not None:
                    if not owner.lock.acquire(blocking=False):
                        continue  # in use right now: not the least recently used in effect
                    try:
                        owner.entries.pop(victim[1], None)
                    finally:
                        owner.lock.release()
                self.total_bytes -= self._items.pop(victim)
                dropped += 1
            self.evicted += dropped
            self._freed = self._freed or dropped > 0
            return dropped


__all__ = ["CacheBudget", "CachedEncoding", "EncodingKey", "FileBudget", "Release", "Session", "StaleKeyError", "media_hash",
           "model_storages", "nbytes"]
