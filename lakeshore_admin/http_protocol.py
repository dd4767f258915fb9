"""uvicorn's HTTP/1.1 protocol (httptools) with a bound on the time a request's head may
take. uvicorn closes an idle kept-alive connection only if no byte at all arrives (its
keep-alive timer is armed after an answer and cancelled by the first byte), and arms
nothing on a new connection: a client that connects and sends nothing, or one byte of
a request line, held its socket for good. Here a connection whose request line and
headers are not all in within the server's keep-alive (gunicorn's `keepalive`, 20 s)
of its opening, or of its last answer, is closed. gunicorn's threaded worker, which
served before, closed a silent connection after its keep-alive too.

It relies on the attributes uvicorn's protocol class sets for itself (`loop`,
`transport`, `timeout_keep_alive`, `timeout_keep_alive_task`) in the pinned version
(requirements.txt); tests/security/test_slow_head.py checks it on the real server."""

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class Protocol(HttpToolsProtocol):
    head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._await_head()

    def on_headers_complete(self) -> None:
        self._head_arrived()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:  # idle now: the next head is due
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._head_arrived()
        self.head_deadline = self.loop.call_later(self.timeout_keep_alive, self._head_late)

    def _head_arrived(self) -> None:
        if self.head_deadline is not None:
            self.head_deadline.cancel()
            self.head_deadline = None

    def _head_late(self) -> None:
        self.head_deadline = None
        if not self.transport.is_closing():
            self.transport.close()
