"""What one sweep call may ask of a shared server (components.core.sweep_queue) and the unpacked zip's life
(components.core.sweep_logic.question_set): the bound and its sentences, the measured pace (per item kind), the
fair queue, the time cap, and a zip's folder, unpacked only when its sweep starts, that counts under the files cap
and is gone once the block ends."""
from __future__ import annotations

import json
import os
import tempfile
import threading
import zipfile

import pytest

from components.core import sweep_logic as SL
from components.core.logic import UserError
from components.core.sweep_queue import Deadline, Pace, SweepLimits, SweepQueue, steps_of
from mipruner.serve.session import FileBudget

PAGE = {"lam": 1.0, "lam_rule": "auto"}
HOSTED = SweepLimits.for_server(True)


def sweep(methods=("mi", "random", "similarity"), values="4,16", param="budget"):
    return SL.make_sweep(list(methods), param, values, 16, {}, "question", 4)


def test_a_sweep_is_counted_in_model_steps():
    # per item: 1 encoding + 1 unpruned answer + mi 2 values + random 2 values x 3 seeds + similarity 2 values
    assert steps_of(sweep(), 10) == 10 * (1 + 1 + 2 + 6 + 2)
    # a method that does not take the swept parameter runs once per item
    assert steps_of(sweep(("mi", "random"), "max,mean", "aggregation"), 1) == 1 + 1 + 2 + 3
    # text_mode: one encoding per mode, one unpruned answer, one answer per mode
    assert steps_of(sweep(("mi",), "question,prompt", "text_mode"), 1) == 2 + 1 + 2


def test_hosted_bounds_refuse_with_a_sentence_and_local_ones_do_not():
    assert HOSTED.max_set_bytes <= 256 << 20 and HOSTED.max_seconds <= 600
    with pytest.raises(UserError, match=r"^Items: this server sweeps at most 100 items per call, got 101$"):
        HOSTED.check(101, 10, None)
    with pytest.raises(UserError, match=r"needs 2,001 model steps.* at most 2,000 per call: use fewer items"):
        HOSTED.check(50, 2001, None)
    with pytest.raises(UserError, match=r"about 10 min at this model's measured speed; this server runs at most "
                                        r"5 min per call"):
        HOSTED.check(50, 600, 600.0)
    HOSTED.check(100, 2000, 299.0)  # at the caps: accepted
    SweepLimits.for_server(False).check(500, 10**6, 10**6)


def test_the_pace_is_measured_per_model():
    pace = Pace(weight=0.5)
    assert pace.estimate("m", 100) is None  # nothing measured yet: only the step cap applies
    pace.observe("m", 2.0, 10)
    assert pace.per_step("m") == 0.2 and pace.estimate("m", 100) == pytest.approx(20.0)
    pace.observe("m", 4.0, 10)  # a running mean
    assert pace.per_step("m") == pytest.approx(0.3) and pace.per_step("other") is None


def test_the_pace_is_measured_per_item_kind():
    """Issue 55, item 11: a sweep of slow clips does not make an ordinary sweep of images be refused."""
    pace = Pace(weight=0.5)
    pace.observe("m", 0.5, 10, "image")  # an ordinary image sweep: 0.05 s a step
    for _ in range(10):
        pace.observe("m", 60.0, 10, "video")  # slow clips: 6 s a step
    assert pace.per_step("m", "image") == 0.05 and pace.per_step("m", "video") == pytest.approx(6.0, rel=1e-3)
    steps = steps_of(sweep(), 20)
    per_item = steps // 20
    est = pace.estimate_items("m", per_item, ["image"] * 20)
    assert est == pytest.approx(0.05 * steps)
    HOSTED.check(20, steps, est)  # accepted: the clips' pace does not count for images
    with pytest.raises(UserError, match="at this model's measured speed"):
        HOSTED.check(20, steps, pace.estimate_items("m", per_item, ["video"] * 20))
    mixed = pace.estimate_items("m", per_item, ["image"] * 19 + ["video"])
    assert mixed == pytest.approx(per_item * (19 * 0.05 + pace.per_step("m", "video")))
    assert pace.estimate_items("m", per_item, ["image", "gif"]) is None  # a kind not measured yet: no estimate


def drain(gen):
    """The places a wait yielded, and its return value."""
    places = []
    while True:
        try:
            places.append(next(gen))
        except StopIteration as e:
            return places, e.value


def test_the_queue_runs_one_sweep_per_visitor_in_arrival_order():
    q = SweepQueue(slots=1, max_waiting=2)
    q.join("a")
    assert drain(q.wait("a")) == ([], True)  # nobody before: runs at once
    q.join("b")
    q.join("c")
    with pytest.raises(UserError, match="each visitor runs one sweep at a time"):
        q.join("b")
    with pytest.raises(UserError, match=r"the sweep queue is full \(2 waiting\)"):
        q.join("d")
    b = q.wait("b", poll_s=0.01)
    assert next(b) == 1 and q.place("c") == 2
    c = q.wait("c", poll_s=0.01, gone=lambda: True)  # c cancels while it waits: it leaves the queue
    assert drain(c) == ([], False) and q.waiting == 1
    releaser = threading.Thread(target=q.leave, args=("a",))
    releaser.start()
    releaser.join()
    assert drain(b) == ([], True) and q.place("b") == 0
    q.leave("b")
    q.join("b")  # done: the visitor may sweep again
    assert drain(q.wait("b")) == ([], True)


def test_the_time_cap_stops_a_sweep():
    now = [0.0]
    stop = threading.Event()
    d = Deadline(stop, 300.0, clock=lambda: now[0])
    assert not d()
    now[0] = 301.0
    assert d() and d.expired
    assert Deadline(stop, None)() is False
    stop.set()
    assert Deadline(stop, None)()


def zeros_zip(path, mib: int) -> str:
    """A zip (a few hundred KB) of `mib` MiB of zeros named big.png, and a questions.jsonl asking about it."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("big.png", "w") as f:
            block = bytes(1 << 20)
            for _ in range(mib):
                f.write(block)
        zf.writestr("questions.jsonl", json.dumps({"media": "big.png", "question": "Is there a cat?",
                                                   "answer": "no"}))
    return str(path)


def sets_in(folder) -> list[str]:
    return [n for n in os.listdir(folder) if n.startswith("mipruner-set-")]


def test_a_zip_is_unpacked_for_the_block_only_and_counts_under_the_files_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    z = zeros_zip(tmp_path / "z.zip", 3)
    limits = SweepLimits(max_set_bytes=2 << 20)
    with pytest.raises(UserError, match=r"^zip: its media unpack to 3 MiB; this server unpacks at most 2 MiB"):
        SL.question_set(SL.SETS[-1], 5, 0, z, limits=limits).__enter__()
    files = FileBudget([tmp_path / "uploads"], 2 << 20)
    with pytest.raises(UserError, match="do not fit in this server's space for files"):
        SL.question_set(SL.SETS[-1], 5, 0, z, files=files).__enter__()
    assert sets_in(tmp_path) == [] and files.held == 0
    files = FileBudget([tmp_path / "uploads"], 8 << 20)
    with SL.question_set(SL.SETS[-1], 5, 0, z, files=files) as (items, name):
        assert name == "z.zip" and len(items) == 1 and SL.kinds_of(items) == ["image"]
        assert sets_in(tmp_path) == [] and files.held == 0  # checked, not unpacked: it waits holding nothing
        with SL.opened(items) as got:  # its sweep starts
            assert os.path.getsize(got[0].media) == 3 << 20
            assert len(sets_in(tmp_path)) == 1 and files.held == 3 << 20
        assert sets_in(tmp_path) == [] and files.held == 0
    with pytest.raises(RuntimeError, match="the sweep failed"):  # a sweep that fails inside the block
        with SL.question_set(SL.SETS[-1], 5, 0, z, files=files) as (items, _), SL.opened(items):
            raise RuntimeError("the sweep failed")
    assert sets_in(tmp_path) == [] and files.held == 0
    with SL.question_set(SL.SETS[-1], 5, 0, z, files=files) as (items, _):
        with files.hold(6 << 20):  # another sweep took the space meanwhile: refused when it starts, one sentence
            with pytest.raises(UserError, match="do not fit in this server's space for files now"):
                SL.opened(items).__enter__()
    assert sets_in(tmp_path) == [] and files.held == 0
