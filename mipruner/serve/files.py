"""`FileBudget`: keeps the folders the app writes files into (rendered panels, exports, a sweep's unpacked
set while it runs, visitors' uploads) under one byte cap on disk, oldest files first; an upload is admitted
only when it fits (`admit`, `reserve`) and is never removed while young (`uploaded`), so a flood of uploads is
refused instead of evicting what other visitors are using. `mipruner.serve.session` offers it too.

What is counted is what the disk holds: every file's and every folder's blocks (`st_blocks * 512`, as `du`
counts), so 100,000 one-byte files count 100,000 blocks, not 100,000 bytes. The count is kept running:
a walk of the folders runs at most every `interval_s` seconds (`maybe_prune`, when the app writes its
panels), or when room is wanted and the last walk is `interval_s` old, or `rescan_s` old and the room is
not there (`make_room`); uploads (`uploaded`) and removals update the count in between, so files the app
itself wrote since the last walk are what the count may miss. `reserve` and `release` are O(1) and never touch the disk: an event loop may call them; only
`make_room`, `prune`, `admit` and `hold` walk the folders (run them in a thread).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time


class FilesFull(ValueError):
    """What is asked for does not fit under the cap beside what is on disk and held."""


def disk_bytes(st: os.stat_result) -> int:
    """Bytes the disk holds for a file or folder: its blocks (st_blocks counts 512-byte units), else its size."""
    blocks = getattr(st, "st_blocks", None)
    return int(blocks) * 512 if blocks is not None else int(st.st_size)


class FileBudget:
    """Keeps folders the app writes files into (rendered panels, exports) under `max_bytes` on disk:
    past it, the files modified longest ago go first (never one younger than `min_age_s`, which a
    page may still be fetching, nor a visitor's upload younger than `upload_age_s`)."""

    def __init__(self, roots, max_bytes: int, *, interval_s: float = 10.0, min_age_s: float = 30.0,
                 upload_age_s: float = 900.0, rescan_s: float = 2.0, clock=time.time):
        if not max_bytes > 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes!r}")
        self.roots = [os.fspath(r) for r in roots]
        self.max_bytes, self.interval_s, self.min_age_s, self.clock = int(max_bytes), interval_s, min_age_s, clock
        self.rescan_s = rescan_s
        self._next = 0.0
        self._lock = threading.Lock()  # the counters and tables below: held for O(1) steps only
        self._scan_lock = threading.Lock()  # one walk of the folders at a time
        self.removed = 0  # files removed since start
        self.held = 0  # bytes counted under the cap while they are on their way (`hold`, `reserve`)
        self.upload_age_s = upload_age_s  # an upload younger than this is never pruned
        self._uploads: dict[str, float] = {}  # real path -> when it was uploaded (`uploaded`)
        self._index: dict[str, tuple[float, int, bool]] = {}  # path -> (mtime, disk bytes, is a folder)
        self._used = 0  # sum of the index's disk bytes: the running count
        self._scanned_at: float | None = None  # monotonic time of the last walk

    # ------------------------------------------------------------------ the running count (O(1))
    def used(self) -> int:
        """Disk bytes counted under the roots plus those held, from the running count (no disk access)."""
        with self._lock:
            return self._used + self.held

    def reserve(self, nbytes: int) -> bool:
        """Count `nbytes` more as held when they fit beside the running count; False (nothing held) if not."""
        nbytes = int(nbytes)
        with self._lock:
            if self._used + self.held + nbytes > self.max_bytes:
                return False
            self.held += nbytes
            return True

    def release(self, nbytes: int) -> None:
        """Give back `nbytes` of what `reserve` or `make_room` held."""
        with self._lock:
            self.held -= int(nbytes)

    def uploaded(self, paths) -> None:
        """Mark `paths` as visitors' uploads: `prune` leaves each alone for `upload_age_s` seconds; their
        blocks (and their new folders') join the running count."""
        now = self.clock()
        roots = self._real_roots()
        seen = []  # (path, its stat or None for the upload's own mark, is a folder)
        for p in paths:
            real = os.path.realpath(os.fspath(p))
            seen.append((real, None, False))
            for q in (os.path.dirname(real), real):
                if q in roots or not any(q.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
                    continue
                try:
                    st = os.stat(q, follow_symlinks=False)
                except OSError:
                    continue
                seen.append((q, st, q != real))
        with self._lock:
            for q, st, is_dir in seen:
                if st is None:
                    self._uploads[q] = now
                else:
                    self._count(q, st.st_mtime, disk_bytes(st), is_dir)
            if len(self._uploads) > 4096:  # forget the old ones (prunable again) so the table stays small
                for p in sorted(self._uploads, key=self._uploads.get)[:len(self._uploads) - 4096]:
                    del self._uploads[p]

    def _real_roots(self) -> list[str]:
        return [os.path.realpath(r) for r in self.roots]

    def _count(self, path: str, mtime: float, nbytes: int, is_dir: bool) -> None:
        """Put `path` in the index (under `_lock`), the running count following."""
        old = self._index.get(path)
        self._used += nbytes - (old[1] if old else 0)
        self._index[path] = (mtime, nbytes, is_dir)

    def _uncount(self, path: str) -> None:
        old = self._index.pop(path, None)
        if old:
            self._used -= old[1]

    # ------------------------------------------------------------------ walking the folders
    def usage(self) -> list[tuple[float, int, str]]:
        """(mtime, disk bytes, path) of every file under the roots (folders not listed)."""
        return [(m, b, p) for p, (m, b, d) in self._walk().items() if not d]

    def _walk(self) -> dict[str, tuple[float, int, bool]]:
        out = {}
        for root in self._real_roots():
            for dirpath, dirs, files in os.walk(root):
                for name, is_dir in [(d, True) for d in dirs] + [(f, False) for f in files]:
                    p = os.path.join(dirpath, name)
                    try:
                        st = os.stat(p, follow_symlinks=False)
                    except OSError:
                        continue
                    out[p] = (st.st_mtime, disk_bytes(st), is_dir)
        return out

    def rescan(self) -> int:
        """Walk the roots and set the running count to what the disk holds; returns the bytes counted."""
        with self._scan_lock:
            index = self._walk()
            with self._lock:
                self._index, self._used = index, sum(v[1] for v in index.values())
                self._scanned_at = time.monotonic()
                return self._used

    def total(self) -> int:
        """Bytes on disk under the roots (after a fresh walk) plus those held."""
        self.rescan()
        return self.used()

    # ------------------------------------------------------------------ making room
    def stale(self) -> bool:
        """Whether the last walk of the folders is `interval_s` old (files the app wrote since are not counted)."""
        with self._lock:
            return self._scanned_at is None or time.monotonic() - self._scanned_at >= self.interval_s

    def _prune_to(self, room: int, fresh: bool = True) -> int:
        """Remove the oldest prunable files until `room` more bytes fit under the cap, after a walk (when `fresh`
        is False, only if the last is `rescan_s` old); returns how many went. Young files and young uploads stay."""
        with self._scan_lock:
            if fresh or self._scanned_at is None or time.monotonic() - self._scanned_at >= self.rescan_s:
                index = self._walk()
                with self._lock:
                    self._index, self._used = index, sum(v[1] for v in index.values())
                    self._scanned_at = time.monotonic()
            now, gone = self.clock(), 0
            with self._lock:
                self._uploads = {p: t for p, t in self._uploads.items() if now - t < self.upload_age_s}
                if self._used + self.held + room <= self.max_bytes:
                    return 0
                files = sorted((m, b, p) for p, (m, b, d) in self._index.items() if not d)
            for mtime, _, path in files:
                with self._lock:
                    if self._used + self.held + room <= self.max_bytes:
                        break
                    young_upload = path in self._uploads
                if now - mtime < self.min_age_s:
                    break
                if young_upload:  # a visitor's recent upload stays
                    continue
                try:
                    os.remove(path)
                except OSError:
                    continue
                gone += 1
                with self._lock:
                    self._uncount(path)
                parent = os.path.dirname(path)
                if parent not in self._real_roots():
                    try:
                        os.rmdir(parent)  # Gradio keeps one folder per file; empty ones go too
                    except OSError:
                        continue
                    with self._lock:
                        self._uncount(parent)
            with self._lock:
                self.removed += gone
            return gone

    def prune(self) -> int:
        """Remove the oldest files until the total is under the cap; returns how many went."""
        return self._prune_to(0)

    def make_room(self, nbytes: int) -> bool:
        """`reserve(nbytes)`, pruning old panels and exports first when they do not fit (never a young upload);
        False (nothing held) when they still do not. Walks the folders when the count is `stale` or the bytes do
        not fit: call it in a thread."""
        if not self.stale() and self.reserve(nbytes):
            return True
        self._prune_to(int(nbytes), fresh=False)
        return self.reserve(nbytes)

    def fits(self, nbytes: int) -> bool:
        """Whether `nbytes` would fit now, after pruning what may go (nothing is held)."""
        if self.make_room(nbytes):
            self.release(nbytes)
            return True
        return False

    @contextlib.contextmanager
    def admit(self, nbytes: int):
        """Count `nbytes` (an upload on its way to disk) under the cap for the block, pruning old non-upload files
        to make room: FilesFull when they do not fit beside what is on disk and held."""
        nbytes = int(nbytes)
        if not self.make_room(nbytes):
            used = self.used()
            raise FilesFull(f"{nbytes:,} bytes do not fit: {used:,} of {self.max_bytes:,} are in use")
        try:
            yield
        finally:
            self.release(nbytes)

    @contextlib.contextmanager
    def hold(self, nbytes: int):
        """Count `nbytes` (e.g. a folder a sweep unpacks while it runs) under the cap for the block: older
        files are pruned to make room; ValueError when they cannot fit beside what others hold."""
        nbytes = int(nbytes)
        with self._lock:
            if nbytes > self.max_bytes - self.held:
                raise ValueError(f"{nbytes >> 20} MiB do not fit in the {self.max_bytes >> 20} MiB this server keeps "
                                 f"for files ({self.held >> 20} MiB are in use by running sweeps)")
            self.held += nbytes
        try:
            self.prune()
            yield
        finally:
            self.release(nbytes)

    def maybe_prune(self) -> int:
        now = self.clock()
        if now < self._next:
            return 0
        self._next = now + self.interval_s
        return self.prune()


__all__ = ["FileBudget", "FilesFull", "disk_bytes"]
