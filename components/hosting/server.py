"""The app's own uvicorn server: request heads timed out, connections per address capped.

uvicorn reads each request head before any ASGI code runs, and Gradio's `launch()` passes uvicorn no option:
a client that opens connections and sends its head a byte at a time (or never) holds a file descriptor each,
for ever, until the server reaches its open-files limit and refuses everyone. So the app serves the page
through Gradio's documented `gradio.mount_gradio_app` on a uvicorn `Server` of its own, whose HTTP protocol
(`guarded_protocol`, uvicorn's h11 protocol with two additions) closes a connection whose head has not arrived
`head_timeout_s` after the connection opened or its last response ended (HTTP 408 and a sentence), and refuses
an address's connection past `max_client_connections` at once (HTTP 429 and a sentence). Bodies are bounded
further in, by `components.hosting.uploads.BodyCap` (counted as they arrive, stalled ones stopped).

On a Space every connection comes from the Space's proxy, which reads each head itself: there the per-address
cap is off by default (it would count the proxy), and the head timeout still holds. A `--share` link and
ZeroGPU keep Gradio's own `launch()` (its tunnel; ZeroGPU's hooks).
"""
from __future__ import annotations

import asyncio
from collections import Counter

HEAD_TIMEOUT = "The request's headers did not arrive within {s:g} s: the connection is closed. Send it again."
TOO_MANY_CONNECTIONS = ("This address has {n} connections open to the server already: close one, or wait for one "
                        "to finish, and try again.")


def _raw(status: str, sentence: str) -> bytes:
    body = sentence.encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode("latin-1") + body


def guarded_protocol(head_timeout_s: float, max_client_connections: int = 0) -> type:
    """uvicorn's h11 protocol class with a head timeout and a per-address connection cap (0: no cap). Each call
    makes a class of its own, with its own count of connections per address (one server's)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    open_by_address: Counter = Counter()

    class GuardedH11Protocol(H11Protocol):
        """A connection waiting for a request head (h11's `their_state` IDLE) has `head_timeout_s` to send it."""

        head_timer: asyncio.TimerHandle | None = None
        address: str | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.address = self.client[0] if self.client else None
            open_by_address[self.address] += 1
            if max_client_connections and open_by_address[self.address] > max_client_connections:
                self._close_with("429 Too Many Requests", TOO_MANY_CONNECTIONS.format(n=max_client_connections))
                return
            self._follow_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._follow_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._follow_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_timer()
            open_by_address[self.address] -= 1
            if open_by_address[self.address] <= 0:
                del open_by_address[self.address]
            super().connection_lost(exc)

        def _follow_head(self) -> None:
            """Arm the timer while a head is awaited, stop it once h11 has read the head."""
            awaiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
            if not awaiting:
                self._stop_timer()
            elif self.head_timer is None:
                self.head_timer = self.loop.call_later(head_timeout_s, self._head_timed_out)

        def _stop_timer(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def _head_timed_out(self) -> None:
            self.head_timer = None
            if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
                self._close_with("408 Request Timeout", HEAD_TIMEOUT.format(s=head_timeout_s))

        def _close_with(self, status: str, sentence: str) -> None:
            self._stop_timer()
            if not self.transport.is_closing():
                self.transport.write(_raw(status, sentence))
                self.transport.close()

    return GuardedH11Protocol


def serve(app, *, host: str, port: int, head_timeout_s: float, max_client_connections: int) -> None:
    """Serve the ASGI `app` (the page: Gradio's app mounted with `gradio.mount_gradio_app`) on host:port with
    `guarded_protocol`, until interrupted."""
    import uvicorn

    # on SIGTERM, open streams (the page's event stream) get 3 s to end before the server stops
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3,
                            http=guarded_protocol(head_timeout_s, max_client_connections))
    print(f"* Running on local URL:  http://{host}:{port}", flush=True)
    uvicorn.Server(config).run()


__all__ = ["HEAD_TIMEOUT", "TOO_MANY_CONNECTIONS", "guarded_protocol", "serve"]
