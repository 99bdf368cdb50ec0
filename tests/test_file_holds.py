"""`FileBudget.hold` across sweeps running at once (one thread each): what one sweep holds counts
against every other's, a hold that does not fit beside them is refused and one that does is taken,
the space comes back when a sweep ends, and the oldest files are pruned to make room for all holds.
The threads are ordered by events: each assertion runs while the other sweep's hold is known to be held."""
from __future__ import annotations

import os
import threading

import pytest

from mipruner.serve.files import FileBudget

MIB = 1 << 20


class Sweep(threading.Thread):
    """A sweep holding `nbytes` until `release` is set; `holding` is set once its hold is taken."""

    def __init__(self, files: FileBudget, nbytes: int):
        super().__init__(daemon=True)
        self.files, self.nbytes = files, nbytes
        self.holding, self.release, self.error = threading.Event(), threading.Event(), None

    def run(self):
        try:
            with self.files.hold(self.nbytes):
                self.holding.set()
                self.release.wait(60)
        except ValueError as e:
            self.error = e
            self.holding.set()

    def __enter__(self):
        self.start()
        assert self.holding.wait(60)
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.join(60)


def test_holds_of_sweeps_at_once_share_the_cap(tmp_path):
    files = FileBudget([tmp_path], 8 * MIB)
    with Sweep(files, 5 * MIB) as a:
        assert a.error is None and files.held == 5 * MIB
        with pytest.raises(ValueError, match=r"5 MiB do not fit in the 8 MiB .* \(5 MiB are in use by running sweeps\)"):
            with files.hold(5 * MIB):
                pass
        assert files.held == 5 * MIB  # a refused hold takes nothing
        with Sweep(files, 3 * MIB) as b:  # fits beside a's
            assert b.error is None and files.held == 8 * MIB
            with Sweep(files, 1) as c:  # a byte more does not
                assert isinstance(c.error, ValueError) and files.held == 8 * MIB
        assert files.held == 5 * MIB
    assert files.held == 0
    with files.hold(8 * MIB):  # once they ended, the whole cap is free again
        assert files.held == 8 * MIB
    assert files.held == 0


def test_files_are_pruned_to_make_room_for_every_hold(tmp_path):
    now = 10_000.0
    files = FileBudget([tmp_path], 8 * MIB, min_age_s=30, clock=lambda: now)
    for i, age in enumerate((300, 200, 100)):  # three old files of 1 MiB, the oldest first
        p = tmp_path / f"f{i}" / "panel.png"
        p.parent.mkdir()
        p.write_bytes(b"x" * MIB)
        os.utime(p, (now - age, now - age))
    with Sweep(files, 4 * MIB):
        assert sorted(os.listdir(tmp_path)) == ["f0", "f1", "f2"]  # 3 + 4 MiB fit
        # 3 + 4 + 3 = 10 MiB (and the folders' blocks): the two oldest files go, with their folders
        with Sweep(files, 3 * MIB - 64 * 1024):
            assert sorted(os.listdir(tmp_path)) == ["f2"]
            assert files.used() == files.total() <= files.max_bytes  # the running count is what the disk holds
