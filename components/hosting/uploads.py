"""Request bodies are counted as they arrive: an ASGI middleware in front of Gradio's routes (`BodyCap`).

Gradio writes every upload (`POST /gradio_api/upload`, any multipart body) to its cache with no regard
for the app's file cap (--files-mb), and reads any other body (`queue/join`'s JSON) into memory whatever
its size. Here no declared length is trusted (a `Content-Length` may lie, `Transfer-Encoding: chunked`
declares none): each piece of a body is counted when it arrives, and the request is stopped at the cap,
whatever the framing, with a sentence (HTTP 413) once the app had what fitted:

  * an upload (a multipart POST) reserves room under the files cap (`FileBudget.reserve`, O(1)) for the
    bytes that arrived, plus one file block and one folder per part (what the disk holds beyond the
    bytes); when they do not fit, old panels and exports are pruned to make room (`FileBudget.make_room`,
    in a worker thread: the event loop never walks the disk), never a young upload. A connection that
    sent only its headers reserves nothing. Gradio's answer names the files written: they join the
    running count as uploads (kept while young), and the reservation is given back;
  * any other body stops at `Limits.max_body_bytes` (--max-body-kb);
  * a body that stalls (no piece for `Limits.idle_s`, --body-timeout-s) or takes longer than
    `Limits.body_s` in all is stopped with HTTP 408;
  * one client (its address; on a Space, the address the Space's proxy forwards) has at most
    `Limits.per_client` requests in progress (--max-client-requests); past it, HTTP 429;
  * a call that runs an event (queue/join, run/, call/) under a session hash Gradio has not seen spends one of
    its address's new sessions (`components.hosting.new_sessions`, --new-sessions-per-min); none left: HTTP 429.

Request heads are read by uvicorn before any ASGI code runs: `components.hosting.server` times them out. No
Gradio here: `app.py` passes the middleware to the app it serves (`app_kwargs`).
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass

import anyio
import anyio.to_thread

from mipruner.serve.session import FileBudget

from .new_sessions import NewSessions

log = logging.getLogger("mipruner.app")

FULL = ("This server's space for uploaded files is full right now ({cap} MiB, shared by every visitor). "
        "Try again in a few minutes, or use a smaller file.")
TOO_BIG = "This request is too large: this server reads at most {kb:,} KiB of data per request (not an upload)."
STALLED = "The request's data stopped arriving (nothing for {idle:g} s, or over {total:g} s in all); send it again."
BUSY = "Too many requests from this address at once (at most {n}); wait for one to finish and try again."
DRAIN_BYTES, DRAIN_S = 1 << 20, 2.0  # read (and drop) this much of a refused body, so the client reads the answer


@dataclass(frozen=True)
class Limits:
    """What one request may send (see the module's docstring)."""

    max_body_bytes: int = 1 << 20  # a body that is not an upload
    idle_s: float = 30.0  # longest wait for the next piece of a body
    body_s: float = 600.0  # longest time for a whole body
    per_client: int = 64  # requests of one client in progress at once
    part_bytes: int = 8192  # room reserved per multipart part beyond its bytes: its last block and its folder
    new_sessions_per_min: float = 20  # new session hashes one client may bring a minute (as many at once; 0: any)


EVENT_ROUTES = ("/queue/join", "/run/", "/call/")  # the routes whose calls run an event in a session


class BodyCap:
    """ASGI middleware: every body counted as it arrives, uploads under `files`' cap (see the module's docstring)."""

    def __init__(self, app, files: FileBudget | None = None, limits: Limits = Limits()):
        self.app, self.files, self.limits = app, files, limits
        self.active: dict[str, int] = defaultdict(int)  # client -> requests in progress
        self.disk = anyio.CapacityLimiter(2)  # threads that walk the disk: never Gradio's handlers' threads
        self.sessions = NewSessions(limits.new_sessions_per_min)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        client = client_key(scope)
        if self.active[client] >= self.limits.per_client:
            log.warning("request from %s refused: %d in progress", client, self.active[client])
            return await _answer(send, 429, BUSY.format(n=self.limits.per_client))
        self.active[client] += 1
        try:
            await _Request(self, scope, receive, send).serve()
        finally:
            self.active[client] -= 1
            if not self.active[client]:
                del self.active[client]


class _Request:
    """One request's counting: what arrived, what is reserved, whether it was refused."""

    def __init__(self, cap: BodyCap, scope, receive, send):
        self.cap, self.scope, self._receive, self._send = cap, scope, receive, send
        ctype = (_header(scope, b"content-type") or "").lower()
        self.upload = cap.files is not None and scope.get("method") == "POST" and ctype.startswith("multipart/form-data")
        self.delim = b"\r\n--" + _boundary(_header(scope, b"content-type") or "").encode("latin-1")
        self.tail = b"\r\n"  # the stream starts with its first delimiter, without the line break
        self.got = self.reserved = 0
        self.done = self.aborted = False
        self.refusal: tuple[int, str] | None = None
        self.started = False  # the app began its answer
        self.answer = bytearray()  # the start of the app's answer to an upload (the paths it wrote)
        self.deadline = time.monotonic() + cap.limits.body_s
        path = str(scope.get("path", ""))
        self.event = scope.get("method") == "POST" and not self.upload and any(r in path for r in EVENT_ROUTES)
        self.body = bytearray()  # an event call's body (under max_body_bytes): its session hash is read at its end

    async def serve(self):
        declared = _header(self.scope, b"content-length")
        if declared is not None and declared.isdigit():  # a length beyond the cap is refused before a byte is read
            await self._check_declared(int(declared))
        error = None
        if self.refusal is None:
            try:
                await self.cap.app(self.scope, self.receive, self.send)
            except Exception as e:  # the app saw the disconnect this middleware gave it
                if self.refusal is None:
                    error = e
        await self._settle()
        if error is not None:
            raise error
        if self.refusal is not None and not self.started:
            if self.refusal[0] != 408:  # a stalled body sends nothing more to drain
                await self._drain()
            await _answer(self._send, *self.refusal)

    async def _check_declared(self, n: int):
        limits, files = self.cap.limits, self.cap.files
        if not self.upload and n > limits.max_body_bytes:
            self.refuse(413, TOO_BIG.format(kb=limits.max_body_bytes >> 10))
        elif self.upload and not await anyio.to_thread.run_sync(files.fits, n, limiter=self.cap.disk):
            self.refuse(413, FULL.format(cap=files.max_bytes >> 20))

    def refuse(self, status: int, sentence: str):
        if self.refusal is None:
            log.warning("request %s %s refused (%d) after %s bytes: %s", self.scope.get("method"),
                        self.scope.get("path"), status, f"{self.got:,}", sentence)
            self.refusal = (status, sentence)

    def _stop(self):
        """What the app reads once the body is refused or the client left. An upload's body ends in a part whose
        header no parser accepts: Gradio's multipart parser then removes the files it began (it keeps them when
        the body ends in a disconnect); any other body ends in a disconnect."""
        if self.upload and not self.aborted:
            self.aborted = True
            return {"type": "http.request", "body": self.delim + b"\r\n\x00\r\n\r\n", "more_body": False}
        return {"type": "http.disconnect"}

    async def receive(self):
        if self.refusal is not None:
            return self._stop()
        if self.done:  # the body is complete: what follows is the wait for a disconnect (a stream's answer)
            return await self._receive()
        limits = self.cap.limits
        wait = min(limits.idle_s, self.deadline - time.monotonic())
        message = None
        with anyio.move_on_after(max(wait, 0)):
            message = await self._receive()
        if message is None:
            self.refuse(408, STALLED.format(idle=limits.idle_s, total=limits.body_s))
            return self._stop()
        if message["type"] != "http.request":  # the client left half-way
            return self._stop()
        chunk = message.get("body", b"")
        self.got += len(chunk)
        self.done = not message.get("more_body", False)
        if self.upload:
            if not await self._reserve(len(chunk) + limits.part_bytes * self._parts(chunk)):
                self.refuse(413, FULL.format(cap=self.cap.files.max_bytes >> 20))
                return self._stop()
        elif self.got > limits.max_body_bytes:
            self.refuse(413, TOO_BIG.format(kb=limits.max_body_bytes >> 10))
            return self._stop()
        elif self.event:
            self.body.extend(chunk)
            if self.done and not self.cap.sessions.admit(client_key(self.scope), _session_of(self.body)):
                self.refuse(429, self.cap.sessions.sentence)
                return self._stop()
        return message

    def _parts(self, chunk: bytes) -> int:
        """Delimiters of the multipart body in `chunk` (one per part, and the closing one), across chunks."""
        data = self.tail + chunk
        self.tail = data[-(len(self.delim) - 1):] if len(self.delim) > 1 else b""
        return data.count(self.delim)

    async def _reserve(self, n: int) -> bool:
        files = self.cap.files
        if not (files.reserve(n) or await anyio.to_thread.run_sync(files.make_room, n, limiter=self.cap.disk)):
            return False
        self.reserved += n
        return True

    async def send(self, message):
        if self.refusal is not None:  # the app answers the disconnect it was given: this middleware answers
            return
        if message["type"] == "http.response.start":
            self.started = True
        elif self.upload and message["type"] == "http.response.body" and len(self.answer) < 1 << 20:
            self.answer.extend(message.get("body", b""))
        await self._send(message)

    async def _settle(self):
        """The files Gradio wrote join the running count as uploads; then the reservation is given back."""
        files = self.cap.files
        if not self.upload:
            return
        try:
            paths = json.loads(bytes(self.answer)) if self.answer[:1] == b"[" and self.refusal is None else []
        except ValueError:
            paths = []
        paths = [p for p in paths if isinstance(p, str)]
        if paths:
            await anyio.to_thread.run_sync(files.uploaded, paths, limiter=self.cap.disk)
        files.release(self.reserved)
        self.reserved = 0

    async def _drain(self):
        """Read a little of a refused body (dropped), so that a client still sending it reads the answer."""
        got = 0
        with anyio.move_on_after(DRAIN_S):
            while not self.done and got < DRAIN_BYTES:
                message = await self._receive()
                if message["type"] != "http.request":
                    break
                got += len(message.get("body", b""))
                self.done = not message.get("more_body", False)


def _session_of(body: bytes) -> str | None:
    """The session hash an event call names (None: none, and Gradio makes it a session of its own)."""
    try:
        got = json.loads(bytes(body))
    except ValueError:
        return None
    session = got.get("session_hash") if isinstance(got, dict) else None
    return session if isinstance(session, str) and session else None


def client_key(scope) -> str:
    """Who sent the request: the peer's address, or on a Space the one its proxy appended to X-Forwarded-For."""
    if os.environ.get("SPACE_ID"):
        forwarded = _header(scope, b"x-forwarded-for")
        if forwarded:
            return forwarded.split(",")[-1].strip()
    client = scope.get("client")
    return str(client[0]) if client else "?"


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k.lower() == name:
            return v.decode("latin-1").strip()
    return None


def _boundary(ctype: str) -> str:
    for param in ctype.split(";")[1:]:
        key, _, value = param.strip().partition("=")
        if key.lower() == "boundary":
            return value.strip().strip('"')
    return ""


async def _answer(send, status: int, sentence: str) -> None:
    body = sentence.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def upload_app_kwargs(files: FileBudget | None, limits: Limits = Limits()) -> dict:
    """`launch(app_kwargs=...)` that puts `BodyCap` in front of the app's routes."""
    from starlette.middleware import Middleware

    return {"middleware": [Middleware(BodyCap, files=files, limits=limits)]}


UploadCap = BodyCap  # its former name

__all__ = ["BUSY", "FULL", "STALLED", "TOO_BIG", "BodyCap", "Limits", "UploadCap", "client_key", "upload_app_kwargs"]
