"""The model's slot is taken in turns between sessions (issue 55, items 8 and 9): a flooder's queue does not
go before another visitor's one request, one session's waiting requests are capped with a sentence, and a
file is decoded before the slot is taken. Every check is by order and counters, never by time."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from PIL import Image

from mipruner.serve.service import ModelService
from mipruner.media import write_video
from mipruner.models.common.dummy import DummyAdapter
from mipruner.serve.turns import Busy, Turns

WAIT = 30.0  # seconds a thread may take to reach a state (a bound for a stuck test, not a timing)


def until(check, what: str) -> None:
    ev = threading.Event()
    for _ in range(3000):
        if check():
            return
        ev.wait(0.01)
    raise AssertionError(f"never reached: {what}")


def queue_up(turns: Turns, owner, got: list, n: int) -> list[threading.Thread]:
    """n threads of `owner`, each queued in order (the next starts once the last one waits)."""
    threads = []
    for _ in range(n):
        before = turns.waiting(owner)

        def one():
            with turns.turn(owner):
                got.append(owner)
        t = threading.Thread(target=one, daemon=True)
        t.start()
        until(lambda: turns.waiting(owner) == before + 1, f"{owner} queued")
        threads.append(t)
    return threads


def test_a_flooders_queue_does_not_go_before_another_sessions_request():
    turns, got = Turns(max_waiting=None), []
    turns.acquire("holder")
    flood = queue_up(turns, "flooder", got, 6)
    visitor = queue_up(turns, "visitor", got, 1)
    turns.release()
    for t in flood + visitor:
        t.join(WAIT)
    assert got == ["flooder", "visitor", "flooder", "flooder", "flooder", "flooder", "flooder"]
    assert list(turns.history) == ["holder", *got] and turns.granted == 8 and not turns.locked()
    assert [n for who, n in turns.waited if who == "visitor"] == [1]  # one flooder's turn while it waited


def test_one_connection_is_one_line_whatever_string_object_names_it():
    """The app names each call's owner by its connection's session hash, a new str object per request: equal
    names share one line (a flooder's calls do not each get a turn of the ring) and one cap."""
    def name(s: str) -> str:
        return "".join(list(s))  # equal, never the same object

    turns, got = Turns(max_waiting=2), []
    turns.acquire("holder")
    flood = []
    for _ in range(2):
        flood += queue_up(turns, name("flooder"), got, 1)
    assert turns.waiting_by_owner() == {"flooder": 2}
    with pytest.raises(Busy, match="2 requests waiting"):
        turns.acquire(name("flooder"))
    visitor = queue_up(turns, name("visitor"), got, 1)
    turns.release()
    for t in flood + visitor:
        t.join(WAIT)
    assert got == ["flooder", "visitor", "flooder"]


def test_three_owners_take_turns_in_a_ring():
    turns, got = Turns(), []
    with turns:  # the anonymous owner (the warm-up, a sweep's item) holds it first
        threads = queue_up(turns, "a", got, 3) + queue_up(turns, "b", got, 2) + queue_up(turns, "c", got, 1)
    for t in threads:
        t.join(WAIT)
    assert got == ["a", "b", "c", "a", "b", "a"]


def test_one_sessions_waiting_requests_are_capped_with_a_sentence():
    turns, got = Turns(max_waiting=2), []
    turns.acquire("other")
    threads = queue_up(turns, "s", got, 2)
    with pytest.raises(Busy, match="this session has 2 requests waiting for the model"):
        turns.acquire("s")
    assert turns.waiting("s") == 2  # the refused one left no ticket
    anon = queue_up(turns, None, got, 3)  # no session's work is never capped
    turns.release()
    for t in threads + anon:
        t.join(WAIT)
    assert sorted(got, key=str) == [None, None, None, "s", "s"] and not turns.locked()


def test_releasing_a_slot_not_held_raises():
    with pytest.raises(RuntimeError, match="not held"):
        Turns().release()


class Reading(DummyAdapter):
    """The dummy model that says when it decodes a file, and whether the model's slot was held meanwhile."""

    def __init__(self):
        super().__init__()
        self.engine = None
        self.reads, self.held_while_reading = 0, []
        self.reading = threading.Event()

    def read_media(self, media):
        self.held_while_reading.append(self.engine.model_lock.locked())
        self.reads += 1
        self.reading.set()
        return super().read_media(media)


def test_a_video_is_decoded_while_another_session_holds_the_model(tmp_path):
    frames = [Image.fromarray(np.full((32, 32, 3), 40 * i, np.uint8)) for i in range(4)]
    path = write_video(frames, str(tmp_path / "clip.mp4"))
    a = Reading()
    engine = a.engine = ModelService(a)
    other, mine = engine.new_session(), engine.new_session()
    done = []
    engine.model_lock.acquire(other)  # another visitor's forward pass is under way
    t = threading.Thread(target=lambda: done.append(engine.encode(mine, path, "what moves?")), daemon=True)
    t.start()
    assert a.reading.wait(WAIT)  # the file is read while the other visitor still holds the model
    until(lambda: engine.model_lock.waiting(mine) == 1, "the encode waits for its turn")
    assert not done and a.reads == 1 and a.held_while_reading == [True]
    engine.model_lock.release()
    t.join(WAIT)
    assert done and engine.encoded(mine, done[0]).is_video and len(engine.encoded(mine, done[0]).frames) == 4
    assert list(engine.model_lock.history) == [id(other), id(mine)]


def test_the_engine_refuses_a_sessions_third_waiting_encode():
    a = Reading()
    engine = a.engine = ModelService(a, max_waiting=2)
    s, other = engine.new_session(), engine.new_session()
    img = [Image.fromarray(np.full((16, 16, 3), v, np.uint8)) for v in (10, 20, 30)]
    engine.model_lock.acquire(other)
    got, threads = [], []
    for im in img[:2]:
        before = engine.model_lock.waiting(s)
        t = threading.Thread(target=lambda im=im: got.append(engine.encode(s, im, "q")), daemon=True)
        t.start()
        until(lambda: engine.model_lock.waiting(s) == before + 1, "queued")
        threads.append(t)
    with pytest.raises(ValueError, match="requests waiting for the model already"):
        engine.encode(s, img[2], "q")
    engine.model_lock.release()
    for t in threads:
        t.join(WAIT)
    assert len(got) == 2


def test_media_decoded_before_the_turn_encode_as_the_file_does(tmp_path):
    """`Adapter.read_media` gives what `encode` reads of the file: encoding it equals encoding the file (the
    embedded LLaVA model), and Qwen's decoded video reads as its file does (frames, indices, fps, total)."""
    import torch

    from mipruner.models.qwen import video as QV
    from mipruner.testing import embedded_encoding

    frames = [Image.fromarray(np.full((48, 48, 3), 25 * i, np.uint8)) for i in range(10)]
    path = write_video(frames, str(tmp_path / "clip.mp4"))
    a, _ = embedded_encoding()
    with torch.no_grad():
        direct, read = a.encode(path, "what moves?"), a.encode(a.read_media(path), "what moves?")
    assert torch.equal(direct.visual, read.visual) and direct.prompt_tokens == read.prompt_tokens
    sample = lambda total, fps: list(range(0, total, 3))  # noqa: E731
    got, want = QV.read_media(QV.decoded(path, sample), sample), QV.read_media(path, sample)
    assert got[1:] == want[1:] and [np.asarray(f).tolist() for f in got[0]] == [np.asarray(f).tolist() for f in want[0]]
