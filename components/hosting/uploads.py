"""Uploads count under the app's file cap (--files-mb): an ASGI middleware in front of Gradio's routes.

Gradio writes every upload (`POST /gradio_api/upload`, and any other multipart body) to its cache with
no regard for the app's cap; the app's `FileBudget` pruned the cache only when it next wrote a file, and
then removed what visitors were using (the example thumbnails among them). Here an upload is admitted
only when its declared length fits under the cap beside what is on disk and what other uploads on their
way hold (`FileBudget.admit`); otherwise it is refused, before a byte is read, with a sentence and HTTP
413. An upload without a declared length is refused too (browsers and gradio_client always declare
one). The paths Gradio answers with are marked as uploads, which the budget never removes while young.
No Gradio here: `app.py` passes the middleware to the app it launches (`launch(app_kwargs=...)`).
"""
from __future__ import annotations

import json
import logging

import anyio

from mipruner.session import FileBudget  # its admit() raises a ValueError (FilesFull) when full

log = logging.getLogger("mipruner.app")

FULL = ("This server's space for uploaded files is full right now ({cap} MiB, shared by every visitor). "
        "Try again in a few minutes, or use a smaller file.")
NO_LENGTH = "Uploads must declare their size (a Content-Length header); send the file as a browser does."


class UploadCap:
    """ASGI middleware: multipart POSTs are admitted under `files`' cap (see the module's docstring)."""

    def __init__(self, app, files: FileBudget):
        self.app, self.files = app, files

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or not _multipart(scope):
            return await self.app(scope, receive, send)
        length = _header(scope, b"content-length")
        if length is None or not length.isdigit():
            return await _refuse(receive, send, 411, NO_LENGTH)
        try:
            ticket = await anyio.to_thread.run_sync(self._admit, int(length))
        except ValueError:  # FilesFull: it does not fit
            log.warning("upload of %s bytes refused: the files cap is full", length)
            return await _refuse(receive, send, 413, FULL.format(cap=self.files.max_bytes >> 20))
        body = bytearray()

        async def send_and_mark(message):
            if message["type"] == "http.response.body" and len(body) < 1 << 20:
                body.extend(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_and_mark)
        finally:
            ticket.__exit__(None, None, None)
        self._mark(bytes(body))

    def _admit(self, nbytes: int):
        ticket = self.files.admit(nbytes)
        ticket.__enter__()
        return ticket

    def _mark(self, body: bytes) -> None:
        """The paths of Gradio's answer to an upload (a JSON list) are visitors' uploads."""
        try:
            paths = json.loads(body) if body[:1] == b"[" else []
        except ValueError:
            return
        self.files.uploaded(p for p in paths if isinstance(p, str))


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k.lower() == name:
            return v.decode("latin-1").strip()
    return None


def _multipart(scope) -> bool:
    return (_header(scope, b"content-type") or "").lower().startswith("multipart/form-data")


async def _refuse(receive, send, status: int, sentence: str) -> None:
    """Answer `sentence`; the body sent is read and dropped (never written), so the client reads the answer."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            break
    body = sentence.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def upload_app_kwargs(files: FileBudget | None) -> dict:
    """`launch(app_kwargs=...)` that puts `UploadCap` in front of the app's routes ({} without a budget)."""
    if files is None:
        return {}
    from starlette.middleware import Middleware

    return {"middleware": [Middleware(UploadCap, files=files)]}


__all__ = ["FULL", "NO_LENGTH", "UploadCap", "upload_app_kwargs"]
