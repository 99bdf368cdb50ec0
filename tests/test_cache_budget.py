"""Memory stays bounded across sessions: one byte cap over every session's cached encodings (least
recently used first, whichever session holds it), sessions the app forgets free their share, and the
files the app writes are kept under a byte cap too."""
from __future__ import annotations

import gc
import os
import sys
import threading

import pytest
import torch

import mipruner
from mipruner.serve.service import ModelService
from mipruner.serve.session import CacheBudget, FileBudget, Session, StaleKeyError, nbytes
from mipruner.serve.session import EncodingKey

EX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "examples")


def key(i: int) -> EncodingKey:
    return EncodingKey("m", f"media{i}", "p", "question", True)


def fill(budget: CacheBudget, session: Session, i: int, size: int) -> EncodingKey:
    k = key(i)
    session.entries[k] = object()
    budget.charge(session, k, size)
    return k


def test_least_recently_used_entry_of_any_session_goes_first():
    b = CacheBudget(1000)
    s1, s2 = Session(budget=b), Session(budget=b)
    k1 = fill(b, s1, 1, 400)
    k2 = fill(b, s2, 2, 400)
    b.touch(s1, k1)  # s1's entry is now the more recent one
    k3 = fill(b, s1, 3, 400)  # 1200 > 1000: s2's entry is the least recently used
    assert list(s2.entries) == [] and list(s1.entries) == [k1, k3]
    assert b.total_bytes == 800 and b.evicted == 1 and len(b) == 2
    fill(b, s2, 4, 900)  # only the entry being charged may stay over the cap on its own
    assert list(s1.entries) == [] and b.total_bytes == 900


def test_an_entry_in_use_is_skipped_and_forget_keeps_the_count():
    b = CacheBudget(1000)
    busy, idle = Session(budget=b), Session(budget=b)
    kb = fill(b, busy, 1, 400)
    ki = fill(b, idle, 2, 400)
    held, done = threading.Event(), threading.Event()

    def hold():
        with busy.lock:
            held.set()
            done.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(30)
    try:
        fill(b, idle, 3, 400)  # busy's entry is older but its session is working: idle's goes
    finally:
        done.set()
        t.join()
    assert kb in busy.entries and ki not in idle.entries
    idle.drop(key(3))  # a session dropping an entry itself (count / age) takes it out of the total
    assert b.total_bytes == 400


def test_forgotten_sessions_free_their_share():
    b = CacheBudget(10_000)
    s = Session(budget=b)
    fill(b, s, 1, 3000)
    assert b.total_bytes == 3000
    del s
    gc.collect()
    assert len(b) == 0 and b.total_bytes == 0


def test_nbytes_counts_each_storage_once_and_skips_weights():
    x = torch.zeros(100, 10)
    lin = torch.nn.Linear(10, 10)
    obj = {"a": x, "b": x[:50], "c": [x.T], "model": lin, "w": lin.weight.detach(), "n": None, "s": "text"}
    skip = frozenset({lin.weight.untyped_storage().data_ptr()})
    python = sys.getsizeof(obj) + sum(map(sys.getsizeof, obj)) + sys.getsizeof(obj["c"]) + sys.getsizeof("text")
    assert nbytes(obj, skip) == 4000 + python  # x once (its view and transpose share it), the containers, the text
    assert nbytes(obj) == 4000 + 400 + python  # the detached weight shares the weight's storage


@pytest.fixture(scope="module")
def adapter():
    return mipruner.load("shapes-llava", device="cpu")


def test_engine_caps_encodings_across_sessions(adapter):
    img = [os.path.join(EX, f"scene_{i}.png") for i in range(3)]
    probe = ModelService(adapter, name="shapes-llava")
    s = probe.new_session()
    k = probe.encode(s, img[0], "is there a circle?")
    probe.view(s, k, ["mi", "random"], 16)
    one = probe.cache.total_bytes
    modules = [m for m in vars(adapter).values() if isinstance(m, torch.nn.Module)]
    weights = sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
    assert 0 < one < weights  # an encoding is charged, the shared model is not
    assert one >= adapter.encode(img[0], "is there a circle?").visual.numel() * 4

    engine = ModelService(adapter, name="shapes-llava", cache=CacheBudget(int(2.5 * one)))
    sessions = [engine.new_session() for _ in range(3)]
    keys = []
    for sess, path in zip(sessions, img):
        keys.append(engine.encode(sess, path, "is there a circle?"))
        engine.view(sess, keys[-1], ["mi", "random"], 16)
    assert engine.cache.total_bytes <= engine.cache.max_bytes and engine.cache.evicted >= 1
    with pytest.raises(StaleKeyError):  # the first session's encoding was the least recently used
        engine.view(sessions[0], keys[0], ["mi"], 16)
    assert [v.kept for v in engine.view(sessions[2], keys[2], ["mi"], 16)] == [16]
    # the same user coming back encodes again, and a later one is evicted instead
    keys[0] = engine.encode(sessions[0], img[0], "is there a circle?")
    engine.view(sessions[0], keys[0], ["mi", "random"], 16)
    assert engine.cache.total_bytes <= engine.cache.max_bytes
    with pytest.raises(StaleKeyError):
        engine.view(sessions[1], keys[1], ["mi"], 16)


def touch(path, size: int, mtime: float):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"x" * size)
    os.utime(path, (mtime, mtime))


def test_file_budget_removes_the_oldest_files_first(tmp_path):
    from mipruner.serve.files import disk_bytes

    now = [10_000.0]
    for i, age in enumerate((900, 600, 300, 100, 5)):  # 5 files of 1000 bytes, one per folder
        touch(str(tmp_path / f"h{i}" / "image.jpeg"), 1000, now[0] - age)
    # what the disk holds for one of them: its blocks and its folder's (the budget counts those, not 1000 bytes)
    unit = disk_bytes(os.stat(tmp_path / "h0" / "image.jpeg")) + disk_bytes(os.stat(tmp_path / "h0"))
    fb = FileBudget([tmp_path], int(2.5 * unit), interval_s=60, min_age_s=30, clock=lambda: now[0])
    assert fb.total() == 5 * unit
    assert fb.maybe_prune() == 3  # over 2.5 units: the three oldest go (the newest is young anyway)
    assert sorted(os.listdir(tmp_path)) == ["h3", "h4"]  # their empty folders too
    assert fb.used() == 2 * unit  # the running count followed the removals
    touch(str(tmp_path / "h5" / "a.png"), 1000, now[0] - 200)
    assert fb.maybe_prune() == 0  # within the interval: no scan
    now[0] += 61
    assert fb.maybe_prune() == 1 and sorted(os.listdir(tmp_path)) == ["h3", "h4"]  # h5 was the oldest
    touch(str(tmp_path / "h6" / "b.png"), 3 * unit, now[0])
    assert fb.prune() == 2 and os.listdir(tmp_path) == ["h6"]  # over the cap, but h6 is too young to go


def test_app_views_keep_written_files_under_the_cap(tmp_path):
    from components.core.logic import AppLogic
    from components.core.settings import Settings
    from components.hosting.hub import ModelHub

    hub = ModelHub("shapes-llava", device="cpu")
    hub.load_default()
    for i in range(4):
        touch(str(tmp_path / f"old{i}" / "panel.jpeg"), 1000, 1.0)
    logic = AppLogic(hub, max_new_tokens=4, files=FileBudget([tmp_path], 1500), export_root=str(tmp_path / "ex"))
    st, _ = logic.encode(None, "shapes-llava", "image", os.path.join(EX, "scene_0.png"), None, "is there a circle?")
    logic.view(st, Settings(methods=("mi",), budget=8))
    assert sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path) for f in fs) <= 1500
    out = logic.export(st, Settings(methods=("mi",), budget=8), logic.new_export_dir())
    assert all(p.startswith(str(tmp_path / "ex")) for p in out)


def test_load_benchmark_is_registered():
    from mipruner.bench.__main__ import COMMANDS
    from mipruner.bench.load import pct, schedule

    assert COMMANDS["load"][0] == "mipruner.bench.load"
    plan = schedule(3, 10)
    assert len(plan) == 10 and [k for k, _ in plan].count("generate") == 2
    assert pct([5.0, 1.0, 3.0], 0.5) == 3.0 and pct([1.0, 2.0, 3.0, 4.0, 100.0], 0.95) == 100.0


def test_load_benchmark_writes_new_scenes_each_round(tmp_path):
    """The load benchmark's inputs: new pictures every round, each with a question about an object
    it shows (a round of the same pictures would be served from the first round's caches)."""
    from PIL import Image

    from mipruner.bench.load import IMAGES_PER_ROUND, round_images
    from mipruner.shapes.scenes import COLORS, SHAPES

    r0, r1 = round_images(str(tmp_path), 0), round_images(str(tmp_path), 1)
    assert len(r0) == len(r1) == IMAGES_PER_ROUND
    pixels = {Image.open(p).tobytes() for p, _ in r0 + r1}
    assert len(pixels) == 2 * IMAGES_PER_ROUND
    for _, prompt in r0 + r1:
        assert any(c in prompt for c in COLORS) and any(s in prompt for s in SHAPES)
