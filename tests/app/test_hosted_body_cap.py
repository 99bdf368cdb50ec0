"""`BodyCap` (components/hosting/uploads.py) on its own, in front of a stand-in for Gradio's routes: the bytes
are counted as they arrive whatever the declared length, a multipart body reserves room for its parts' blocks,
bodies stop at their caps, a stalled body is stopped, one client's requests are capped, and an idle upload
reserves nothing. The clock is never read by an assertion: the stall's timeout is the only wait, and what is
checked is the answer, not how long it took."""
from __future__ import annotations

import json
import os
import threading

import anyio
import pytest

from components.hosting.uploads import BUSY, FULL, STALLED, TOO_BIG, BodyCap, Limits
from mipruner.serve.files import FileBudget

MIB = 1 << 20
BOUNDARY = b"xyzzy"


class Disconnected(Exception):
    """What Starlette raises when the body ends in a disconnect."""


class Routes:
    """Reads the whole body; an upload writes it as one file under `root` and answers its path."""

    def __init__(self, root):
        self.root, self.read, self.aborted = root, [], 0

    async def __call__(self, scope, receive, send):
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.read.append(len(body))
                raise Disconnected()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if body.endswith(b"\r\n\x00\r\n\r\n"):  # a part header no multipart parser takes: Gradio's removes
            self.read.append(len(body))  # the files it began and answers 400
            self.aborted += 1
            raise Disconnected()
        self.read.append(len(body))
        answer = b"{}"
        if scope["path"] == "/upload":
            folder = os.path.join(self.root, f"u{len(self.read)}")
            os.makedirs(folder)
            with open(os.path.join(folder, "f.bin"), "wb") as f:
                f.write(body)
            answer = json.dumps([os.path.join(folder, "f.bin")]).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": answer})


def scope(path="/upload", declared=None, client="10.0.0.1", multipart=True):
    headers = [(b"content-type", b"multipart/form-data; boundary=" + BOUNDARY if multipart else b"application/json")]
    if declared is not None:
        headers.append((b"content-length", str(declared).encode()))
    else:
        headers.append((b"transfer-encoding", b"chunked"))
    return {"type": "http", "method": "POST", "path": path, "headers": headers, "client": (client, 1234)}


def body_of(chunks, stall_after=None):
    """An ASGI receive giving `chunks`, then (with `stall_after`) nothing more after that many."""
    pieces = list(chunks)

    async def receive():
        i = receive.n
        receive.n += 1
        if stall_after is not None and i >= stall_after:
            await anyio.sleep(3600)
        if i < len(pieces):
            return {"type": "http.request", "body": pieces[i], "more_body": i < len(pieces) - 1}
        await anyio.sleep(3600)  # the client waits for the answer
    receive.n = 0
    return receive


def run(cap, scope_, receive):
    sent = []

    async def send(message):
        sent.append(message)

    async def go():
        await cap(scope_, receive, send)
    anyio.run(go)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()


def part(data: bytes) -> bytes:
    return b"--" + BOUNDARY + b"\r\ncontent-disposition: form-data; name=\"files\"; filename=\"a\"\r\n\r\n" + data + b"\r\n"


def test_a_lying_length_or_chunks_stop_at_the_cap(tmp_path):
    files = FileBudget([tmp_path], 4 * MIB)
    routes = Routes(tmp_path)
    cap = BodyCap(routes, files)
    chunks = [part(b"x" * (256 << 10))[: 256 << 10]] + [b"x" * (256 << 10)] * 63  # 16 MiB in one part
    for declared in (10, None):  # Content-Length: 10 (a lie) and no length at all (chunked)
        status, text = run(cap, scope(declared=declared), body_of(chunks))
        assert (status, text) == (413, FULL.format(cap=4))
        assert routes.read[-1] <= 4 * MIB + 100  # the app never had more than the cap
        assert routes.aborted == len(routes.read)  # and its body ended in a part its parser refuses
        assert files.held == 0 and files.total() <= 4 * MIB
    status, text = run(cap, scope(declared=16 * MIB), body_of(chunks))  # a declared length past the cap
    assert (status, text) == (413, FULL.format(cap=4)) and len(routes.read) == 2  # refused before the app read
    ok = [part(b"y" * 1000) + b"--" + BOUNDARY + b"--\r\n"]
    assert run(cap, scope(declared=len(ok[0])), body_of(ok))[0] == 200  # an honest upload still fits
    assert files.used() == files.total() > 1000  # counted as the disk holds it (its blocks and its folder)


def test_each_part_reserves_its_blocks(tmp_path):
    files = FileBudget([tmp_path], MIB)
    cap = BodyCap(Routes(tmp_path), files, Limits(part_bytes=8192))
    tiny = b"".join(part(b"x") for _ in range(200)) + b"--" + BOUNDARY + b"--\r\n"  # 200 one-byte files: 22 kB
    pieces = [tiny[i:i + 7] for i in range(0, len(tiny), 7)]  # delimiters split across pieces are counted too
    assert run(cap, scope(), body_of(pieces)) == (413, FULL.format(cap=1))  # 200 x 8 KiB of blocks do not fit
    assert files.held == 0
    fewer = b"".join(part(b"x") for _ in range(20)) + b"--" + BOUNDARY + b"--\r\n"
    assert run(cap, scope(), body_of([fewer]))[0] == 200


def test_other_bodies_stop_at_their_cap(tmp_path):
    routes = Routes(tmp_path)
    cap = BodyCap(routes, FileBudget([tmp_path], MIB), Limits(max_body_bytes=64 << 10))
    big = [b"{" + b" " * (16 << 10)] * 64  # 1 MiB of JSON, chunked
    assert run(cap, scope("/queue/join", multipart=False), body_of(big)) == (413, TOO_BIG.format(kb=64))
    assert routes.read[-1] <= 64 << 10
    assert run(cap, scope("/queue/join", declared=10, multipart=False), body_of(big))[0] == 413  # a lying length
    assert run(cap, scope("/queue/join", declared=1 << 30, multipart=False), body_of(big))[0] == 413
    assert run(cap, scope("/queue/join", multipart=False), body_of([b"{}"]))[0] == 200


def test_a_stalled_body_is_stopped_and_reserved_nothing(tmp_path):
    files = FileBudget([tmp_path], 4 * MIB)
    cap = BodyCap(Routes(tmp_path), files, Limits(idle_s=0.2, body_s=60))
    # headers, a declared length of 3 MiB, and nothing: no room is held while it waits
    seen = []

    async def receive():
        seen.append(files.held)
        await anyio.sleep(3600)
    assert run(cap, scope(declared=3 * MIB), receive) == (408, STALLED.format(idle=0.2, total=60))
    assert seen == [0] and files.held == 0
    chunks = [part(b"x" * 1000)] * 3
    assert run(cap, scope(), body_of(chunks, stall_after=2))[0] == 408  # a body that stops half-way
    assert files.held == 0


def test_one_client_has_a_bounded_number_of_requests_in_progress(tmp_path):
    cap = BodyCap(Routes(tmp_path), FileBudget([tmp_path], MIB), Limits(per_client=3, idle_s=30))
    answers = {}

    async def go():
        release = anyio.Event()

        async def slow():
            await release.wait()
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def one(name, client, receive):
            sent = []

            async def send(m):
                sent.append(m)
            await cap(scope("/queue/join", client=client, multipart=False), receive, send)
            answers[name] = next(m["status"] for m in sent if m["type"] == "http.response.start")

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(one, f"held{i}", "10.0.0.1", slow)
            while sum(cap.active.values()) < 3:
                await anyio.sleep(0)
            await one("fourth", "10.0.0.1", body_of([b"{}"]))  # the same client: refused at once
            await one("other", "10.0.0.2", body_of([b"{}"]))  # another client: served
            release.set()
        await one("after", "10.0.0.1", body_of([b"{}"]))  # once they ended, served again
    anyio.run(go)
    assert answers == {"held0": 200, "held1": 200, "held2": 200, "fourth": 429, "other": 200, "after": 200}
    assert cap.active == {}
    assert BUSY.format(n=3).startswith("Too many requests from this address")


def hosted_args() -> list[str]:
    return ["--model", "shapes-llava", "--host", "0.0.0.0"]


def test_limits_come_from_the_flags():
    import app

    args = app.parse_args(["--model", "shapes-llava", "--max-body-kb", "64", "--body-timeout-s", "5",
                           "--max-client-requests", "8"])
    assert app.body_limits(args) == Limits(max_body_bytes=64 << 10, idle_s=5, body_s=100, per_client=8,
                                           new_sessions_per_min=0)  # local: any number of new sessions
    hosted = app.parse_args(["--model", "shapes-llava", "--host", "0.0.0.0"])
    assert app.body_limits(hosted).new_sessions_per_min == 20
    assert app.body_limits(app.parse_args([*hosted_args(), "--new-sessions-per-min", "5"])).new_sessions_per_min == 5
    with pytest.raises(SystemExit, match="--new-sessions-per-min must be >= 0"):
        app.body_limits(app.parse_args(["--model", "shapes-llava", "--new-sessions-per-min", "-1"]))
    with pytest.raises(SystemExit, match="--max-client-requests must be > 0"):
        app.body_limits(app.parse_args(["--model", "shapes-llava", "--max-client-requests", "0"]))


def test_uploads_resume_once_old_panels_can_make_room(tmp_path):
    """Issue 51: panels within one upload of the cap no longer lock uploads out: once they are old enough to go,
    admitting an upload removes them (a young panel, a page may still fetch it, stays)."""
    now = [1000.0]
    files = FileBudget([tmp_path], 4 * MIB, min_age_s=30, interval_s=0, clock=lambda: now[0])
    for i in range(3):
        (tmp_path / f"p{i}").mkdir()
        (tmp_path / f"p{i}" / "panel.png").write_bytes(b"x" * MIB)
        os.utime(tmp_path / f"p{i}" / "panel.png", (now[0] - 5, now[0] - 5))  # young
    assert not files.make_room(2 * MIB) and files.held == 0  # 3 MiB of young panels: a 2 MiB upload waits
    now[0] += 60  # the panels aged
    assert files.make_room(2 * MIB)  # the oldest panels went to make room
    assert files.held == 2 * MIB and files.used() <= files.max_bytes and len(os.listdir(tmp_path)) == 1
    files.release(2 * MIB)


def test_the_event_loop_never_waits_for_a_walk_of_the_disk(tmp_path):
    """Issue 51: the middleware's own steps take no lock a walk of the folders holds: with a walk in progress
    (its lock held here), an upload and a JSON call are still counted and answered."""
    files = FileBudget([tmp_path], 4 * MIB, interval_s=3600)
    files.rescan()  # fresh: the running count is used as it is
    cap = BodyCap(Routes(tmp_path), files)
    body = [part(b"y" * 1000) + b"--" + BOUNDARY + b"--\r\n"]
    got = []

    def serve():
        got.append(run(cap, scope(), body_of(body))[0])
        got.append(run(cap, scope("/queue/join", multipart=False), body_of([b"{}"]))[0])
    with files._scan_lock:  # another thread's walk of 100,000 files, say
        loop = threading.Thread(target=serve, daemon=True)
        loop.start()
        loop.join(60)  # a step that waited for the walk would wait here until the walk ends: never
        assert not loop.is_alive() and got == [200, 200]
    assert files.held == 0 and files.used() > 1000
