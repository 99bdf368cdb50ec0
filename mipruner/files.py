"""`FileBudget`: keeps the folders the app writes files into (rendered panels, exports, a sweep's unpacked
set while it runs, visitors' uploads) under one byte cap on disk, oldest files first; an upload is admitted
only when it fits (`admit`) and is never removed while young (`uploaded`), so a flood of uploads is refused
instead of evicting what other visitors are using. `mipruner.session` offers it too."""
from __future__ import annotations

import contextlib
import os
import threading
import time


class FilesFull(ValueError):
    """What is asked for does not fit under the cap beside what is on disk and held."""


class FileBudget:
    """Keeps folders the app writes files into (rendered panels, exports) under `max_bytes`:
    past it, the files modified longest ago go first (never one younger than `min_age_s`, which a
    page may still be fetching). `maybe_prune` scans at most every `interval_s` seconds."""

    def __init__(self, roots, max_bytes: int, *, interval_s: float = 10.0, min_age_s: float = 30.0,
                 upload_age_s: float = 900.0, clock=time.time):
        if not max_bytes > 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes!r}")
        self.roots = [os.fspath(r) for r in roots]
        self.max_bytes, self.interval_s, self.min_age_s, self.clock = int(max_bytes), interval_s, min_age_s, clock
        self._next = 0.0
        self._lock = threading.Lock()
        self.removed = 0  # files removed since start
        self.held = 0  # bytes of folders outside the roots counted under the cap while they exist (`hold`)
        self.upload_age_s = upload_age_s  # an upload younger than this is never pruned
        self._uploads: dict[str, float] = {}  # real path -> when it was uploaded (`uploaded`)

    def uploaded(self, paths) -> None:
        """Mark `paths` as visitors' uploads: `prune` leaves each alone for `upload_age_s` seconds."""
        now = self.clock()
        with self._lock:
            for p in paths:
                self._uploads[os.path.realpath(os.fspath(p))] = now
            if len(self._uploads) > 4096:  # forget the old ones (prunable again) so the table stays small
                for p in sorted(self._uploads, key=self._uploads.get)[:len(self._uploads) - 4096]:
                    del self._uploads[p]

    def total(self) -> int:
        """Bytes on disk under the roots plus those held."""
        return sum(f[1] for f in self.usage()) + self.held

    @contextlib.contextmanager
    def admit(self, nbytes: int):
        """Count `nbytes` (an upload on its way to disk) under the cap for the block, without removing
        anything: FilesFull when they do not fit beside what is on disk and held."""
        nbytes = int(nbytes)
        with self._lock:
            used = sum(f[1] for f in self.usage()) + self.held
            if used + nbytes > self.max_bytes:
                raise FilesFull(f"{nbytes:,} bytes do not fit: {used:,} of {self.max_bytes:,} are in use")
            self.held += nbytes
        try:
            yield
        finally:
            with self._lock:
                self.held -= nbytes

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
            with self._lock:
                self.held -= nbytes

    def usage(self) -> list[tuple[float, int, str]]:
        """(mtime, size, path) of every file under the roots."""
        out = []
        for root in self.roots:
            for dirpath, _, files in os.walk(root):
                for f in files:
                    p = os.path.join(dirpath, f)
                    try:
                        st = os.stat(p, follow_symlinks=False)
                    except OSError:
                        continue
                    out.append((st.st_mtime, st.st_size, p))
        return out

    def prune(self) -> int:
        """Remove the oldest files until the total is under the cap; returns how many went."""
        with self._lock:
            files = sorted(self.usage())
            total, now, gone = sum(f[1] for f in files) + self.held, self.clock(), 0
            self._uploads = {p: t for p, t in self._uploads.items() if now - t < self.upload_age_s}
            for mtime, size, path in files:
                if total <= self.max_bytes or now - mtime < self.min_age_s:
                    break
                if os.path.realpath(path) in self._uploads:  # a visitor's recent upload stays
                    continue
                try:
                    os.remove(path)
                except OSError:
                    continue
                total -= size
                gone += 1
                parent = os.path.dirname(path)
                if parent not in self.roots:
                    try:
                        os.rmdir(parent)  # Gradio keeps one folder per file; empty ones go too
                    except OSError:
                        pass
            self.removed += gone
            return gone

    def maybe_prune(self) -> int:
        now = self.clock()
        if now < self._next:
            return 0
        self._next = now + self.interval_s
        return self.prune()


__all__ = ["FileBudget", "FilesFull"]
