"""Every visitor keeps a turn (issue 55, items 8 and 9), against the app launched on 127.0.0.1 and driven
through its API with gradio_client, bounded in count and time:

- a flooder queues FLOOD encodes from one connection: at most MAX_CALLS of them are under way at once (the
  rest are refused at once, one sentence each), and another visitor's Run gets the model after at most those,
  not after the whole flood (with Gradio's one-at-a-time queue of before: after 11 of the 12);
- a video being decoded does not hold the model: while the decoding is held up (the test holds the
  decoder's one call), another visitor's Run is answered.

The flood test holds the model's slot itself while the flood and the visitor arrive, so nothing finishes
meanwhile and the order is the turns' alone. Turns are asserted by the engine's counters (`Turns.history`), not by time; the visitor's times, unloaded
and under each attack, are printed (`pytest -s`) and stated in docs/app.md."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from PIL import Image

from components.core.logic import AppLogic
from components.core.settings import Settings
from components.page.calls import MAX_CALLS
from components.page.controls import control_values
from mipruner import media as M
from mipruner.serve.turns import label

from .conftest import free_port

FLOOD = 12
PROMPT = "is there a red circle?"
WAIT = 120.0  # a bound for a stuck test, not a timing


def ctl() -> list:
    return control_values(Settings(methods=("mi",), budget=16), 196)


def picture(path, seed: int) -> str:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)
    return str(path)


@pytest.fixture(scope="module")
def app(hub):
    from components.page.ui import build_demo, launch_kwargs

    demo = build_demo(AppLogic(hub, max_new_tokens=4), auto_answers=False)
    port = free_port()
    demo.queue(default_concurrency_limit=4).launch(server_name="127.0.0.1", server_port=port,
                                                   prevent_thread_lock=True, quiet=True, **launch_kwargs())
    yield f"http://127.0.0.1:{port}/", hub.get("shapes-llava")[0]
    demo.close()


def client(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def encode_args(path: str, kind: str = "image") -> list:
    from gradio_client import handle_file

    image, video = (handle_file(path), None) if kind == "image" else (None, handle_file(path))
    return ["shapes-llava", "", kind, image, video, PROMPT, *ctl()]


def run_once(c, path: str) -> float:
    t = time.perf_counter()
    status = c.predict(*encode_args(path), api_name="/encode")[0]
    assert "waiting for the model" not in str(status)
    return time.perf_counter() - t


def test_a_flooders_encodes_do_not_go_before_another_visitors_run(app, tmp_path):
    url, engine = app
    turns = engine.model_lock
    visitor = client(url)
    unloaded = run_once(visitor, picture(tmp_path / "warm.png", 0))  # the first call warms the path up
    unloaded = run_once(visitor, picture(tmp_path / "v0.png", 1))
    flooder = client(url)
    # The test holds the model's slot while the flood and the visitor arrive, so no call finishes meanwhile:
    # the order below is decided by the turns alone, never by how fast this machine is.
    turns.acquire(None)
    held = True
    try:
        jobs = [flooder.submit(*encode_args(picture(tmp_path / f"f{i}.png", 100 + i)), api_name="/encode")
                for i in range(FLOOD)]
        deadline = time.monotonic() + WAIT
        while sum(j.done() for j in jobs) + turns.waiting_by_owner().get(flooder.session_hash, 0) < FLOOD:
            assert time.monotonic() < deadline, f"the flood never reached the model's line: {turns.waiting_by_owner()}"
            time.sleep(0.02)  # every flood call is refused or waits in the model's line
        queued = turns.waiting_by_owner()[flooder.session_hash]
        before = turns.granted
        t = time.perf_counter()
        mine_job = visitor.submit(*encode_args(picture(tmp_path / "v1.png", 2)), api_name="/encode")
        while turns.waiting_by_owner().get(visitor.session_hash, 0) < 1:
            assert time.monotonic() < deadline + WAIT, "the visitor's Run never reached the model's line"
            assert not mine_job.done(), mine_job.result()  # neither refused nor stuck behind the flood's workers
            time.sleep(0.02)
        turns.release()
        held = False
        assert "waiting for the model" not in str(mine_job.result(timeout=WAIT)[0])
        loaded = time.perf_counter() - t
    finally:
        if held:
            turns.release()
    results = []
    for j in jobs:
        try:
            results.append(j.result(timeout=WAIT))
        except Exception as e:  # noqa: BLE001: a refused call raises the app's sentence
            results.append(e)
    after = list(turns.history)[-(turns.granted - before):]
    mine = after.index(visitor.session_hash)  # the flooder's turns between the visitor's asking and its turn
    waited = [n for who, n in turns.waited if who == visitor.session_hash][-1]
    print(f"\nvisitor's Run: {unloaded:.2f} s unloaded, {loaded:.2f} s under a flood of {FLOOD} encodes; "
          f"flood calls in the model's line: {queued}; turns before the visitor's: {mine}")
    assert 1 <= queued <= MAX_CALLS  # the flooder's calls under way are capped, the rest refused at once
    assert set(after[:mine]) <= {flooder.session_hash}
    assert mine == waited <= 1  # round robin: one of the flooder's waiting calls at most, not its whole line
    refused = [r for r in results if isinstance(r, Exception)]
    print("refusals:", sorted({str(r)[:90] for r in refused}))
    assert len(refused) == FLOOD - queued
    assert all("requests under way already" in str(r) or "waiting for the model already" in str(r) for r in refused)
    assert sum(not isinstance(r, Exception) for r in results) == queued  # the waiting ones are encoded in turn


def test_a_video_being_decoded_does_not_hold_the_model(app, tmp_path, monkeypatch):
    url, engine = app
    turns = engine.model_lock
    frames = [Image.fromarray(np.full((64, 64, 3), 20 * i, np.uint8)) for i in range(8)]
    clip = M.write_video(frames, str(tmp_path / "clip.mp4"))
    decoding, release = threading.Event(), threading.Event()
    real = M._decode

    def held_up(*args, **kw):  # the decoder's call, held until the visitor has been answered
        decoding.set()
        assert release.wait(WAIT)
        return real(*args, **kw)

    monkeypatch.setattr(M, "_decode", held_up)
    attacker, visitor = client(url), client(url)
    job = attacker.submit(*encode_args(clip, "video"), api_name="/encode")
    try:
        assert decoding.wait(WAIT)  # the attacker's video is being decoded now
        held = turns.locked()
        t = time.perf_counter()
        loaded = run_once(visitor, picture(tmp_path / "v2.png", 3))  # answered while the decoding goes on
        print(f"\nvisitor's Run while a video decodes: {time.perf_counter() - t:.2f} s")
        assert not held and not job.done() and loaded < WAIT
    finally:
        release.set()
    job.result(timeout=WAIT)  # the attacker's video is encoded in its turn
    assert label(None) is None and turns.history[-1] != turns.history[-2]  # the visitor's turn, then the video's
