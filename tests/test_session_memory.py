"""What a session holds is what the byte cap counts, and what the cap drops is gone (issue 51 §1, issue 55 §10).

Counts and bytes only, never RSS or timing: the entry's charged size equals `nbytes` of everything it holds (the
encoding, its frames, the selection cache, the panels' picture, the drawn maps, the answers), each of those parts
is in it, an evicted entry's objects are freed, dropped bytes are handed back to the operating system (`Release`),
and sessions that never encoded charge nothing and evict nothing. The RSS curve itself is measured by
`python -m mipruner.bench memory` (docs/app.md).
"""
from __future__ import annotations

import functools
import gc
import os
import sys
import weakref

import pytest
import torch
from PIL import Image

import mipruner
from mipruner.serve.service import ModelService
from mipruner.serve.session import CacheBudget, CachedEncoding, EncodingKey, Release, Session, StaleKeyError, nbytes

EX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "examples")
CLIP = os.path.join(EX, "clip_0.mp4")
PROMPT = "is there a circle?"


@pytest.fixture(scope="module")
def adapter():
    return mipruner.load("shapes-llava", device="cpu")


def charged(engine: ModelService, session: Session, key) -> int:
    return engine.cache.size_of(session, key)


def held(engine: ModelService, entry) -> int:
    return nbytes(entry, engine._weights, (engine.adapter,))


def pixels(img) -> int:
    return img.width * img.height * len(img.getbands())


@pytest.mark.parametrize("media", ["image", "video"])
def test_every_part_of_an_entry_is_charged(adapter, media):
    """After encode, view and generate the cap holds exactly what the entry holds, and that covers the encoding,
    the selection cache, the panels' picture, every drawn map and every answer: drop any of them from the count
    (or forget to charge after a step) and the equalities below fail."""
    engine = ModelService(adapter, name="shapes-llava", cache=CacheBudget(1 << 30))
    s = engine.new_session()
    path = CLIP if media == "video" else os.path.join(EX, "scene_0.png")
    k = engine.encode(s, path, PROMPT, need_attention=True)
    e = s.entries[k]
    after_encode = charged(engine, s, k)
    assert after_encode == held(engine, e) >= nbytes(e.encoded.visual)
    if media == "video":
        assert e.encoded.frames and after_encode >= sum(pixels(f) for f in e.encoded.frames)  # the decoded frames

    budget = 300 if media == "video" else 16
    engine.view(s, k, ["mi", "random"], budget)
    after_view = charged(engine, s, k)
    assert after_view == held(engine, e)
    drawn = [d for _, d in e.drawings.values()]
    assert drawn and e.layout is not None and e.mi_cache
    images = [x for d in drawn for x in (d if isinstance(d, tuple) else (d,)) if isinstance(x, Image.Image)]
    assert images and after_view - after_encode >= sum(map(pixels, images))  # the drawn maps are counted

    engine.generate(s, k, "mi", budget, max_new_tokens=2)
    engine.generate(s, k, None, max_new_tokens=2)
    assert len(e.answers) == 2
    after_answers = charged(engine, s, k)
    assert after_answers == held(engine, e) > after_view  # the answers are counted
    assert engine.cache.total_bytes == after_answers  # one session, one entry: the cap holds this and nothing else


def test_nbytes_reaches_closures_strings_slots_and_deep_nesting():
    """An unbuilt lazy value holds its inputs in a closure; an answer holds text; records nest: all are counted.
    Shared objects (the adapter) and modules are not."""
    t = torch.zeros(1000)  # 4,000 bytes
    deep = [t]
    for _ in range(40):  # deeper than any fixed depth limit
        deep = [deep]
    assert nbytes(deep) >= 4000
    assert nbytes(lambda: t) >= 4000  # a closure's cell
    assert nbytes(functools.partial(print, t)) >= 4000

    class Slotted:
        __slots__ = ("x",)

        def __init__(self, x):
            self.x = x

    assert nbytes(Slotted(t)) >= 4000
    text = "x" * 10_000
    assert nbytes({"answer": text}) >= sys.getsizeof(text)

    class Shared:
        def __init__(self):
            self.big = torch.zeros(10_000)

    shared = Shared()
    assert nbytes({"adapter": shared}) >= 40_000
    assert nbytes({"adapter": shared}, shared=(shared,)) < 1000  # the app's one adapter is never a session's
    assert nbytes([torch.nn.Linear(100, 100)]) < 1000


def test_an_evicted_entry_frees_everything_it_held():
    """The cap drops the least recently used entry and nothing keeps its tensors, pictures or answers alive."""
    rel = Release(every_s=0.0, defer=False)
    b = CacheBudget(1000, release=rel)
    s1, s2 = Session(budget=b), Session(budget=b)
    k1, k2 = EncodingKey("m", "a", "p", "question", True), EncodingKey("m", "b", "p", "question", True)
    visual, picture = torch.zeros(100), Image.new("RGB", (8, 8))
    e = s1.put(k1, visual, 0.0)
    e.drawings["mask"] = (torch.zeros(3), picture)
    e.answers["a"] = torch.ones(5)
    refs = [weakref.ref(visual), weakref.ref(e.answers["a"]), weakref.ref(e)]
    b.charge(s1, k1, nbytes(e))
    del e, visual
    s2.put(k2, torch.zeros(10), 1.0)
    b.charge(s2, k2, 900)  # over the cap: s1's entry goes
    assert k1 not in s1.entries and b.evicted == 1 and b.total_bytes == 900
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    assert rel.count == 1  # and the freed bytes went back to the OS once


def test_release_runs_after_drops_at_most_once_per_interval():
    now = [100.0]
    rel = Release(every_s=10.0, clock=lambda: now[0], defer=False)  # the server's default puts it off on a timer
    b = CacheBudget(1000, release=rel)
    s = Session(budget=b)
    keys = [EncodingKey("m", f"x{i}", "p", "question", True) for i in range(4)]
    for k in keys[:2]:
        s.entries[k] = CachedEncoding(encoded=None)
        b.charge(s, k, 400)
    assert rel.count == 0  # nothing dropped: nothing to release
    s.entries[keys[2]] = CachedEncoding(encoded=None)
    b.charge(s, keys[2], 400)  # 1200 > 1000: one dropped
    assert rel.count == 1
    s.drop(keys[2])  # a session dropping an entry itself (count, age): released at the next charge
    s.entries[keys[3]] = CachedEncoding(encoded=None)
    b.charge(s, keys[3], 10)
    assert rel.count == 1  # within the interval: kept for later
    now[0] += 11
    b.charge(s, keys[3], 10)
    assert rel.count == 2
    b.charge(s, keys[3], 10)
    assert rel.count == 2  # nothing new dropped


def test_sessions_that_never_encoded_cost_nothing_and_evict_nothing(adapter):
    """Issue 55 §10: hundreds of visitors who only read or set the settings charge no byte and drop no encoding."""
    from components.core.logic import AppLogic, UIState, UserError
    from components.core.settings import Settings
    from components.hosting.hub import ModelHub

    hub = ModelHub("shapes-llava", device="cpu")
    hub.load_default()
    logic = AppLogic(hub, max_new_tokens=2)
    st, _ = logic.encode(None, "shapes-llava", "image", os.path.join(EX, "scene_0.png"), None, PROMPT)
    cache = hub.get(None)[0].cache
    before = (len(cache), cache.total_bytes, cache.evicted)
    for _ in range(300):
        visitor = UIState()
        Settings.parse("m=mi,random&b=8")  # what /settings does: no session, no engine
        with pytest.raises(UserError):
            logic.view(visitor, Settings(methods=("mi",), budget=8))  # nothing encoded: refused, nothing made
        assert visitor.session is None
    assert (len(cache), cache.total_bytes, cache.evicted) == before
    views, _ = logic.view(st, Settings(methods=("mi",), budget=8))  # the visitor who encoded still has it
    assert [v.kept for v in views] == [8]
    with pytest.raises(StaleKeyError):
        hub.get(None)[0].entry(Session(), st.key)  # another session never sees it


def test_memory_benchmark_is_registered_and_judges_the_last_third():
    from mipruner.bench.__main__ import COMMANDS
    from mipruner.bench.memory import levels_off

    assert COMMANDS["memory"][0] == "mipruner.bench.memory"
    assert levels_off([500, 600, 650, 700, 702, 705]) == (True, pytest.approx(705 / 700 - 1))
    ok, spread = levels_off([500, 600, 650, 700, 760, 820])  # still climbing: 700 -> 820 is +17%
    assert not ok and spread == pytest.approx(820 / 700 - 1)
    assert levels_off([1.0] * 8 + [1.2])[0] is False  # the last third of 9 is 3 samples, the jump among them
    with pytest.raises(ValueError, match="samples"):
        levels_off([1.0, 1.0, 1.0])


def test_a_release_put_off_runs_by_itself():
    """Entries dropped just after a release are handed back once the interval ends, with no later request."""
    import threading

    rel = Release(every_s=0.2, clock=lambda: 0.0)  # a frozen clock: every later call is within the interval
    assert rel() and rel.count == 1
    assert not rel()  # within the interval: put off, on a timer
    timer = rel._timer
    assert timer is not None and not rel()  # one timer at a time
    timer.join(30)
    assert rel.count == 2 and rel._timer is None and threading.active_count() >= 1
