"""Issue 55's disk, memory and connection attacks against app.py started as a Space (SPACE_ID set, the embedded
model, 127.0.0.1 only) with small caps (--files-mb 16, --max-body-kb 256, --body-timeout-s 2): each leaves the
upload folder under the cap as the disk counts it (blocks), the server's RSS back within 10% of its start where
the attack is about memory, and the server answering another visitor. Each attack is bounded in bytes, requests
and seconds; the tiny-files flood runs last (it fills the cap with young uploads)."""
from __future__ import annotations

import io
import os
import socket
import time
import uuid

import pytest

from components.core.examples import load_examples
from components.hosting.uploads import FULL, STALLED, TOO_BIG
from mipruner.serve.files import disk_bytes

from .test_bad_inputs import CTL, Raw, _bomb, assert_plain
from .test_space import start_space

CAP_MB = 16
EXAMPLE = next(e for e in load_examples() if e["kind"] == "image")


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits-tmp")
    proc, url, log = start_space(tmp_path_factory, TMPDIR=str(tmp), MIPRUNER_MODEL="shapes-llava",
                                 MIPRUNER_FILES_MB=str(CAP_MB), MIPRUNER_MAX_BODY_KB="256",
                                 MIPRUNER_BODY_TIMEOUT_S="2", MIPRUNER_MAX_CLIENT_REQUESTS="24")
    raw = Raw(url)
    ok, out = raw.call("encode", ["shapes-llava", "", "image", {"path": EXAMPLE["path"]}, None, EXAMPLE["prompt"], *CTL])
    assert ok, out  # warm: the model has run once before any RSS is read
    yield proc, url, tmp / "gradio-mipruner", raw
    proc.terminate()
    proc.wait(30)


def on_disk(folder) -> int:
    """What the disk holds under `folder`: every file's and folder's blocks (as `du`)."""
    total = 0
    for d, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                total += disk_bytes(os.stat(os.path.join(d, name), follow_symlinks=False))
            except OSError:
                pass
    return total


def rss(proc) -> int:
    with open(f"/proc/{proc.pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def settles(proc, start: int, within: float = 0.10, wait_s: float = 30) -> int:
    """The RSS once it is within `within` of `start` (polled for up to `wait_s` seconds); the last one read."""
    deadline = time.monotonic() + wait_s
    while True:
        now = rss(proc)
        if now <= start * (1 + within) or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


def upload(url, name="photo.png", data=None):
    import httpx

    data = data if data is not None else open(EXAMPLE["path"], "rb").read()
    return httpx.post(url + "gradio_api/upload", files={"files": (name, data, "image/png")}, timeout=60)


def answers(space):
    """Another visitor is served: an upload is taken, or refused with the cap's sentence; a view encodes."""
    _, url, _, _ = space
    r = upload(url)
    assert r.status_code == 200 or (r.status_code == 413 and r.text == FULL.format(cap=CAP_MB)), (r.status_code, r.text)
    ok, out = Raw(url).call("encode", ["shapes-llava", "", "image", {"path": EXAMPLE["path"]}, None,
                                       EXAMPLE["prompt"], *CTL])
    assert ok and "196 visual tokens" in out[1], out


def raw_request(url, head: str, chunks, read_s: float = 20) -> tuple[int | None, str, int]:
    """Send `head` then `chunks` on one socket until the server stops reading; (status, body, bytes sent)."""
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=read_s) as s:
        try:
            s.sendall(head.encode("latin-1"))
            for c in chunks:
                s.sendall(c)
                sent += len(c)
        except OSError:  # the server answered and closed while the body was still on its way
            pass
        data = b""
        try:
            while True:
                got = s.recv(65536)
                if not got:
                    break
                data += got
        except OSError:
            pass
    if not data.startswith(b"HTTP/1.1 "):
        return None, "", sent
    head_, _, body = data.partition(b"\r\n\r\n")
    return int(head_.split()[1]), body.decode(errors="replace"), sent


def chunked(pieces):
    for p in pieces:
        yield b"%x\r\n" % len(p) + p + b"\r\n"
    yield b"0\r\n\r\n"


def test_a_lying_or_missing_length_stops_at_the_cap(space):
    proc, url, cache, _ = space
    boundary = uuid.uuid4().hex
    start = b"--" + boundary.encode() + b'\r\ncontent-disposition: form-data; name="files"; filename="big.png"\r\n\r\n'
    piece = os.urandom(256 << 10)
    for lie in ("Content-Length: 10\r\n", ""):  # a length that lies, and none (chunked only)
        head = (f"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\n{lie}Transfer-Encoding: chunked\r\n"
                f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n")
        status, body, sent = raw_request(url, head, chunked([start] + [piece] * 256))  # 64 MiB on its way
        assert status in (413, 400, None), (status, body)
        if status == 413:
            assert body == FULL.format(cap=CAP_MB)
        assert sent < 40 << 20, sent  # the server stopped reading long before the 64 MiB
        assert on_disk(cache) <= CAP_MB << 20, on_disk(cache)
    answers(space)


def test_json_bodies_stop_at_their_cap_and_memory_comes_back(space):
    proc, url, _, _ = space
    start = rss(proc)
    blob = b"[" + b" " * (1 << 20)
    for i in range(40):  # 40 bodies of 4 MiB each (160 MiB), half chunked, half with a lying length
        lie = "Content-Length: 10\r\n" if i % 2 else ""
        head = (f"POST /gradio_api/queue/join HTTP/1.1\r\nHost: x\r\n{lie}Transfer-Encoding: chunked\r\n"
                "Content-Type: application/json\r\n\r\n")
        status, body, _ = raw_request(url, head, chunked([blob] * 4))
        assert status in (413, 400, None), (status, body)
        if status == 413:
            assert body == TOO_BIG.format(kb=256)
    end = settles(proc, start)
    assert end <= start * 1.10, (start >> 20, end >> 20)
    answers(space)


def test_an_image_is_never_converted_into_a_file_past_the_cap(space):
    proc, url, cache, raw = space
    start = rss(proc)
    r = upload(url, "x.bmp", _bomb(12_000))  # 144 megapixels of 1-bit PNG, about 20 kB, named .bmp
    assert r.status_code == 200, r.text
    path = r.json()[0]
    ok, msg = raw.call("encode", ["shapes-llava", "", "image", {"path": path, "orig_name": "x.bmp",
                                                                "meta": {"_type": "gradio.FileData"}},
                                  None, "what is it?", *CTL])
    assert not ok and "too large to open safely" in msg, msg
    assert_plain(msg)
    biggest = max(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cache) for f in fs)
    assert biggest < 1 << 20 and on_disk(cache) <= CAP_MB << 20  # no BMP of hundreds of MiB was written
    assert settles(proc, start) <= start * 1.10
    answers(space)


def test_an_image_that_is_not_rgb_is_read_as_it_was_sent(space):
    """Gradio hands the upload on unconverted (image_mode=None): the app converts a greyscale picture itself."""
    from PIL import Image

    _, url, _, raw = space
    buf = io.BytesIO()
    Image.open(EXAMPLE["path"]).convert("L").save(buf, "PNG")
    r = upload(url, "grey.bmp", buf.getvalue())  # named .bmp: the name chooses nothing
    assert r.status_code == 200, r.text
    ok, out = raw.call("encode", ["shapes-llava", "", "image", {"path": r.json()[0], "orig_name": "grey.bmp",
                                                                "meta": {"_type": "gradio.FileData"}},
                                  None, EXAMPLE["prompt"], *CTL])
    assert ok and "196 visual tokens" in out[1], out


def video_of(path, frames: int, size, raw_stream: bool) -> None:
    """A video of `frames` flat frames: an MP4, or (raw_stream) an MPEG-4 elementary stream, which states no
    frame count, written under an .mp4 name."""
    import av
    from PIL import Image

    with av.open(str(path), "w", format="m4v" if raw_stream else "mp4") as out:
        s = out.add_stream("mpeg4", rate=30)
        s.width, s.height = size
        s.pix_fmt = "yuv420p"
        frame = av.VideoFrame.from_image(Image.new("RGB", size, (90, 30, 200)))
        for _ in range(frames):
            for p in s.encode(frame):
                out.mux(p)
        for p in s.encode():
            out.mux(p)


def test_video_decoding_is_bounded_while_it_runs(space, tmp_path):
    from gradio_client import Client

    from .test_bad_inputs import encode

    proc, url, cache, raw = space
    endless, huge = tmp_path / "endless.mp4", tmp_path / "huge.mp4"
    video_of(endless, 4000, (32, 32), True)  # 70 kB that state no frame count and decode 4,000 frames
    video_of(huge, 2, (4112, 2160), False)  # 100 kB of frames just past 4K
    client = Client(url, verbose=False)
    for path, expected in ((endless, "more than 3,600 frames"), (huge, "frames of 4112x2160 pixels")):
        ok, msg = encode(client, video=str(path))
        assert not ok and expected in msg, (path.name, msg)
        assert_plain(msg)
    answers(space)


def test_a_sweep_item_is_decoded_under_the_same_bounds(space, tmp_path):
    import json
    import zipfile

    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from .test_hosted_sweeps import submit_sweep

    _, url, cache, _ = space
    video_of(tmp_path / "endless.mp4", 4000, (32, 32), True)
    zipped = tmp_path / "set.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.write(tmp_path / "endless.mp4", "endless.mp4")
        zf.writestr("questions.jsonl", json.dumps({"media": "endless.mp4", "question": "what moves?", "answer": "yes"}))
    with pytest.raises(AppError, match="more than 3,600 frames"):
        submit_sweep(Client(url, verbose=False), zip_file=str(zipped), n=1).result(timeout=300)
    assert on_disk(cache) <= CAP_MB << 20
    answers(space)


def test_idle_uploads_reserve_nothing_and_time_out(space):
    _, url, _, _ = space
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    idle = []
    for _ in range(12):  # 12 uploads declaring 12 MiB each (of a 16 MiB cap), that send only their headers
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Length: 12582912\r\n"
                  b"Content-Type: multipart/form-data; boundary=b\r\n\r\n")
        idle.append(s)
    try:
        r = upload(url)  # meanwhile another visitor's upload is taken: nothing was reserved for them
        assert r.status_code == 200, (r.status_code, r.text)
        for s in idle:  # each is stopped once its body stalls (--body-timeout-s 2)
            data = b""
            while b"\r\n\r\n" not in data:
                got = s.recv(4096)
                if not got:
                    break
                data += got
            assert data.startswith(b"HTTP/1.1 408"), data[:200]
        assert STALLED.format(idle=2, total=40).encode() in data + s.recv(4096)
    finally:
        for s in idle:
            s.close()
    answers(space)


def test_one_client_holds_a_bounded_number_of_requests(space):
    import httpx

    from components.hosting.uploads import BUSY

    _, url, _, _ = space
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    slow = []
    for _ in range(24):  # --max-client-requests 24: JSON calls that declare a body and never send it
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"POST /gradio_api/queue/join HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                  b"Content-Type: application/json\r\n\r\n")
        slow.append(s)
    try:
        deadline = time.monotonic() + 20
        while True:  # the 25th request of this address is refused at once while they are in progress
            r = httpx.get(url + "config", timeout=30)
            if r.status_code == 429 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert (r.status_code, r.text) == (429, BUSY.format(n=24))
        # each stalls and is stopped (--body-timeout-s 2); those past the cap (the fixture's own streams count
        # for this address too) were refused at once
        codes = [s.recv(4096)[:12] for s in slow]
        assert set(codes) <= {b"HTTP/1.1 408", b"HTTP/1.1 429"} and codes.count(b"HTTP/1.1 408") >= 12, codes
    finally:
        for s in slow:
            s.close()
    assert httpx.get(url + "config", timeout=30).status_code == 200  # the address is served again
    answers(space)


def test_many_tiny_files_count_as_the_disk_holds_them(space):
    """Last: 1,000 one-byte files per request fill the cap with young uploads (a block and a folder each)."""
    _, url, cache, _ = space
    import httpx

    codes = []
    for r in range(6):  # at most 6,000 files
        files = [("files", (f"t{r}-{i}.png", f"{r}-{i}".encode(), "image/png")) for i in range(1000)]
        codes.append(httpx.post(url + "gradio_api/upload", files=files, timeout=120).status_code)
        assert on_disk(cache) <= CAP_MB << 20, (codes, on_disk(cache))
        if codes[-1] != 200:
            break
    assert codes[-1] == 413, codes  # refused once the blocks, not the bytes, fill the cap
    assert sum(1 for _, _, fs in os.walk(cache) for _ in fs) < (CAP_MB << 20) // 8192  # not 100,000 files
    answers(space)
