"""`python -m mipruner.bench attacks`: a hostile visitor's attacks on a hosted launch, and another visitor's Run.

Starts `app.py` of this checkout as a Space starts it (SPACE_ID set, the embedded model, the hub offline) on
127.0.0.1 with `--files-mb` (64) and short body and head timeouts, then makes each attack of issue 55 from
another address (127.0.0.2, so per-address caps tell the two apart) while a second visitor (127.0.0.1, a new
session each time) presses Run: an encode of the example picture and a view of its panels. For each attack it
reports the visitor's Run under attack against its unloaded time (the median of `--repeats` Runs before any
attack, interleaved: one more unloaded Run after each attack), the server's RSS before the attack and once it
settles after it, and the upload folder's disk use (blocks, as `du`) against the cap; and what the attack got
(its HTTP statuses or sentences). Every attack is bounded in count, bytes and seconds.

    python -m mipruner.bench attacks [--only slow-heads,session-flood] [--repeats 3] [--json out.json]

Goals (issue 55): the visitor's Run within 2 s of its unloaded time, RSS back within 10%, the disk under the cap.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import socket
import statistics
import tempfile
import time
import uuid
import zlib

from .cli import command_parser, names, write_json
from .hosted import FILES_MB, Server

ATTACKER = "127.0.0.2"


def attacker(**kw):
    import httpx

    return httpx.Client(transport=httpx.HTTPTransport(local_address=ATTACKER), timeout=120, **kw)


def sock(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(ATTACKER, 0))


def until_closed(s: socket.socket) -> bytes:
    data = b""
    try:
        while got := s.recv(65536):
            data += got
    except OSError:
        pass
    return data


def status(data: bytes) -> str:
    return data.split(b"\r\n", 1)[0][9:12].decode(errors="replace") or "closed"


def counted(codes) -> str:
    out: dict = {}
    for c in codes:
        out[c] = out.get(c, 0) + 1
    return ", ".join(f"{n} x {c}" for c, n in sorted(out.items()))


# ------------------------------------------------------------------------------------------- the attacks

def lying_upload(srv: Server) -> str:
    """One upload declaring Content-Length: 10 that sends 256 MiB chunked."""
    s = sock(srv.port)
    s.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nTransfer-Encoding: chunked\r\n"
              b"Content-Type: multipart/form-data; boundary=b\r\n\r\n")
    part = b"--b\r\nContent-Disposition: form-data; name=\"files\"; filename=\"a.bin\"\r\n\r\n" + b"x" * (1 << 20)
    sent = 0
    try:
        for i in range(256):
            piece = part if i == 0 else b"x" * (1 << 20)
            s.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            sent += 1
    except OSError:
        pass
    data = until_closed(s)
    s.close()
    return f"{status(data)} after {sent} MiB sent"


def json_bodies(srv: Server) -> str:
    """40 JSON bodies of 4 MiB each to queue/join, 8 at a time."""
    with attacker() as c, cf.ThreadPoolExecutor(8) as pool:
        body = b'{"data": ["' + b"x" * (4 << 20) + b'"]}'
        codes = list(pool.map(lambda _: str(c.post(srv.url + "gradio_api/queue/join", content=body,
                                                   headers={"content-type": "application/json"}).status_code),
                              range(40)))
    return counted(codes)


def png_bomb(side: int = 12_000) -> bytes:
    """A 1-bit black PNG of side x side (144 megapixels at 12,000), ~20 KB."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    z = zlib.compressobj(9)
    row = b"\x00" * (1 + (side + 7) // 8)
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = side.to_bytes(4, "big") * 2 + bytes([1, 0, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _upload_and_encode(srv: Server, name: str, data: bytes, use: str) -> str:
    with attacker() as c:
        r = c.post(srv.url + "gradio_api/upload", files={"files": (name, data)})
        if r.status_code != 200:
            return f"upload {r.status_code}"
        path = r.json()[0]
        ok, out = srv.call("encode", {"use": use, use: {"path": path, "meta": {"_type": "gradio.FileData"}},
                                      "prompt": "what is this?"}, uuid.uuid4().hex[:11], client=c)
    return "encoded" if ok else f"refused: {str(out)[:70]}"


def image_bomb(srv: Server) -> str:
    """A 144-megapixel 1-bit PNG named x.bmp, uploaded and encoded."""
    return _upload_and_encode(srv, "x.bmp", png_bomb(), "image")


def endless_video(srv: Server) -> str:
    """An MPEG-4 stream of 20,000 frames (its header states no count) under an .mp4 name, uploaded and encoded."""
    import av
    from PIL import Image

    path = os.path.join(tempfile.mkdtemp(prefix="mipruner-attack-"), "endless.mp4")
    with av.open(path, "w", format="m4v") as out:
        s = out.add_stream("mpeg4", rate=30)
        s.width = s.height = 32
        s.pix_fmt = "yuv420p"
        frame = av.VideoFrame.from_image(Image.new("RGB", (32, 32), (90, 30, 200)))
        for _ in range(20_000):
            for p in s.encode(frame):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return _upload_and_encode(srv, "endless.mp4", open(path, "rb").read(), "video")


def idle_uploads(srv: Server) -> str:
    """12 uploads declaring 12 MiB each that send only their headers."""
    socks = [sock(srv.port) for _ in range(12)]
    for s in socks:
        s.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Length: 12582912\r\n"
                  b"Content-Type: multipart/form-data; boundary=b\r\n\r\n")
    codes = [status(until_closed(s)) for s in socks]
    for s in socks:
        s.close()
    return counted(codes)


def slow_heads(srv: Server) -> str:
    """300 connections that send half a request head and then nothing."""
    socks = []
    for i in range(300):
        s = sock(srv.port)
        s.sendall(b"GET /config HTTP/1.1\r\nHost: x\r\nX-Slow: %d" % i)
        socks.append(s)
    codes = [status(until_closed(s)) for s in socks]
    for s in socks:
        s.close()
    return counted(codes)


def request_flood(srv: Server) -> str:
    """40 JSON calls from one address that declare a body and never send it (the per-address cap is 24)."""
    socks = [sock(srv.port) for _ in range(40)]
    for s in socks:
        s.sendall(b"POST /gradio_api/queue/join HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                  b"Content-Type: application/json\r\n\r\n")
    codes = [status(until_closed(s)) for s in socks]
    for s in socks:
        s.close()
    return counted(codes)


def encode_flood(srv: Server) -> str:
    """12 encodes at once from one session (new scenes: each a real encode)."""
    from mipruner.shapes import scenes as sc

    folder = tempfile.mkdtemp(prefix="mipruner-attack-")
    paths = []
    for i in range(12):
        paths.append(os.path.join(folder, f"f{i}.png"))
        sc.make_scene(12_000, i).pil()[0].save(paths[-1])
    session = uuid.uuid4().hex[:11]
    with attacker() as c:
        uploaded = [c.post(srv.url + "gradio_api/upload", files={"files": open(p, "rb")}).json()[0] for p in paths]
        events = [srv.join("encode", {"image": {"path": p, "meta": {"_type": "gradio.FileData"}},
                                      "prompt": "is there a red circle?"}, session, c) for p in uploaded]
        got = srv.collect(session, [e for e in events if e], c)  # one stream for the session, as a page has
    served = sum(ok for ok, _ in got.values())
    return f"{served} served, {len(events) - served} refused"


def session_flood(srv: Server) -> str:
    """600 throw-away sessions, each one /settings call."""
    with attacker() as c, cf.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: srv.call("settings", {"settings": "x"}, uuid.uuid4().hex[:11], client=c)[1],
                            range(600)))
    refused = got.count("refused")
    return f"{len(got) - refused} sessions opened, {refused} refused"


def tiny_files(srv: Server) -> str:
    """Up to 6 uploads of 1,000 one-byte files each."""
    codes = []
    with attacker() as c:
        for r in range(6):
            files = [("files", (f"t{r}-{i}.png", b"x")) for i in range(1000)]
            codes.append(str(c.post(srv.url + "gradio_api/upload", files=files).status_code))
            if codes[-1] != "200":
                break
    return counted(codes)


ATTACKS = {"lying-upload": lying_upload, "json-bodies": json_bodies, "image-bomb": image_bomb,
           "endless-video": endless_video, "idle-uploads": idle_uploads, "slow-heads": slow_heads,
           "request-flood": request_flood, "encode-flood": encode_flood, "session-flood": session_flood,
           "tiny-files": tiny_files}  # tiny-files last: it fills the cap with young uploads


def settle(srv: Server, start: float, within: float = 0.10, wait_s: float = 30) -> float:
    deadline = time.monotonic() + wait_s
    while (now := srv.rss()) > start * (1 + within) and time.monotonic() < deadline:
        time.sleep(0.5)
    return now


def one(srv: Server, name: str, lead_s: float, log=print) -> dict:
    """Make attack `name` while the visitor presses Run `lead_s` seconds into it; then an unloaded Run."""
    start = srv.rss()
    with cf.ThreadPoolExecutor(1) as pool:
        attack = pool.submit(ATTACKS[name], srv)
        time.sleep(lead_s)
        try:
            loaded, failed = srv.run(), ""
        except RuntimeError as e:
            loaded, failed = float("nan"), str(e)
        outcome = attack.result(timeout=600)
    after = settle(srv, start)
    row = {"attack": name, "got": outcome, "visitor_s": round(loaded, 3), "visitor_failed": failed,
           "unloaded_after_s": round(srv.run(), 3), "rss_start_mb": round(start, 1), "rss_after_mb": round(after, 1),
           "disk_mb": round(srv.disk_mb(), 2), "cap_mb": FILES_MB}
    log(f"{name:<14} visitor {row['visitor_s']:.2f} s (then {row['unloaded_after_s']:.2f} s), RSS {start:.0f} -> "
        f"{after:.0f} MiB, disk {row['disk_mb']:.1f}/{FILES_MB} MiB; attack got: {outcome}{'; ' + failed if failed else ''}")
    return row


def main(argv=None) -> int:
    p = command_parser("attacks", __doc__)
    p.add_argument("--only", type=names, default=list(ATTACKS), help="attacks, comma-separated (default: all): "
                   + ", ".join(ATTACKS))
    p.add_argument("--repeats", type=int, default=3, help="unloaded Runs before the attacks (default 3)")
    p.add_argument("--lead", type=float, default=0.5, help="seconds into each attack the visitor presses Run")
    p.add_argument("--head-timeout-s", type=float, default=5.0, help="the app's --head-timeout-s (default 5)")
    p.add_argument("--body-timeout-s", type=float, default=5.0, help="the app's --body-timeout-s (default 5)")
    p.add_argument("--json", default="", help="also write the report here")
    a = p.parse_args(argv)
    unknown = [n for n in a.only if n not in ATTACKS]
    if unknown:
        p.error(f"--only: no attack {', '.join(unknown)} (there are: {', '.join(ATTACKS)})")
    srv = Server(tempfile.mkdtemp(prefix="mipruner-attacks-"), a.head_timeout_s, a.body_timeout_s)
    try:
        srv.run()  # warm
        unloaded = statistics.median(srv.run() for _ in range(max(1, a.repeats)))
        print(f"server pid {srv.proc.pid} on {srv.url}; the visitor's unloaded Run: {unloaded:.2f} s (median of "
              f"{a.repeats}); RSS {srv.rss():.0f} MiB")
        rows = [one(srv, n, a.lead) for n in ATTACKS if n in a.only]
    finally:
        srv.proc.terminate()
        srv.proc.wait(30)
    for r in rows:
        r["within_2s"] = r["visitor_s"] <= unloaded + 2.0
        r["rss_within_10pct"] = r["rss_after_mb"] <= r["rss_start_mb"] * 1.10
        r["disk_under_cap"] = r["disk_mb"] <= FILES_MB
    ok = all(r["within_2s"] and r["rss_within_10pct"] and r["disk_under_cap"] for r in rows)
    print(f"{sum(r['within_2s'] for r in rows)}/{len(rows)} attacks: the visitor's Run within 2 s of "
          f"{unloaded:.2f} s; RSS back within 10%: {sum(r['rss_within_10pct'] for r in rows)}/{len(rows)}; disk under "
          f"the cap: {sum(r['disk_under_cap'] for r in rows)}/{len(rows)}")
    write_json(a.json, {"unloaded_s": round(unloaded, 3), "attacks": rows, "ok": ok})
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
