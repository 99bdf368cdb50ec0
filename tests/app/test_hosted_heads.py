"""Issue 55 §7 against a hosted launch (SPACE_ID set, the embedded model, 127.0.0.1, `--head-timeout-s 2`,
`--max-client-connections 40`): connections that never finish their request head are closed with HTTP 408 and
a sentence, however slowly they trickle bytes; an address past its connection cap is refused at once with HTTP
429; meanwhile another visitor is served; RSS comes back within 10%. Bounded: at most 45 sockets, ~20 s."""
from __future__ import annotations

import socket
import time

import pytest

from components.hosting.server import HEAD_TIMEOUT, TOO_MANY_CONNECTIONS

from .test_bad_inputs import CTL, Raw
from .test_hosted_limits import EXAMPLE, rss, settles
from .test_space import start_space

HEAD_S = 2
CONNECTIONS = 40


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    proc, url, _ = start_space(tmp_path_factory, TMPDIR=str(tmp_path_factory.mktemp("heads-tmp")),
                               MIPRUNER_MODEL="shapes-llava", MIPRUNER_HEAD_TIMEOUT_S=str(HEAD_S),
                               MIPRUNER_MAX_CLIENT_CONNECTIONS=str(CONNECTIONS))
    visitor = Raw(url)
    ok, out = visitor.call("encode", ["shapes-llava", "", "image", {"path": EXAMPLE["path"]}, None,
                                      EXAMPLE["prompt"], *CTL])
    assert ok, out
    yield proc, int(url.rstrip("/").rsplit(":", 1)[1]), visitor
    proc.terminate()
    proc.wait(30)


def reply(s: socket.socket) -> bytes:
    """All the server sends before it closes the connection."""
    data = b""
    try:
        while got := s.recv(4096):
            data += got
    except OSError:
        pass
    return data


def test_heads_that_never_end_are_closed_and_a_visitor_is_served(space):
    proc, port, visitor = space
    start = rss(proc)
    slow = []
    for i in range(30):  # 30 connections that send half a head and then nothing
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"GET /config HTTP/1.1\r\nHost: x\r\nX-Slow: " + str(i).encode())
        slow.append(s)
    try:
        t0 = time.perf_counter()
        ok, out = visitor.call("view", CTL)
        print(f"\nvisitor's view beside 30 unfinished heads: {time.perf_counter() - t0:.2f} s")
        assert ok, out
        for s in slow:
            data = reply(s)
            assert data.startswith(b"HTTP/1.1 408"), data[:200]
            assert data.endswith(HEAD_TIMEOUT.format(s=HEAD_S).encode()), data
    finally:
        for s in slow:
            s.close()
    assert settles(proc, start) <= start * 1.10


def test_a_head_sent_a_byte_at_a_time_is_closed_before_it_ends(space):
    _, port, _ = space
    head = b"GET /config HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 40 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        sent = 0
        try:
            for byte in head:  # 4 bytes a second: the whole head would take ~15 s, the timeout is 2 s
                s.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.25)
        except OSError:  # closed by the server
            pass
        data = reply(s)
    assert sent < len(head) and data.startswith(b"HTTP/1.1 408"), (sent, data[:200])


def test_keep_alive_requests_on_one_connection_are_served(space):
    _, port, _ = space
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        for _ in range(3):  # each head comes at once; the wait between them is under the timeout
            s.sendall(b"GET /gradio_api/info HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data:
                data += s.recv(4096)
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += s.recv(65536)
            time.sleep(HEAD_S / 2)


def test_an_address_has_a_bounded_number_of_connections(space):
    _, port, visitor = space
    held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(CONNECTIONS + 5)]
    try:  # sent nothing: those past the cap are refused at once, the others closed when their head is late
        replies = [reply(s) for s in held]
    finally:
        for s in held:
            s.close()
    refused = [r for r in replies if r.startswith(b"HTTP/1.1 429")]
    timed_out = [r for r in replies if r.startswith(b"HTTP/1.1 408")]
    assert len(refused) + len(timed_out) == len(held), [r[:40] for r in replies]
    assert len(refused) >= 5 and len(timed_out) <= CONNECTIONS, (len(refused), len(timed_out))
    assert all(r.endswith(TOO_MANY_CONNECTIONS.format(n=CONNECTIONS).encode()) for r in refused)
    ok, out = visitor.call("view", CTL)  # the address is served again
    assert ok, out
