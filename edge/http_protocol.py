"""uvicorn's HTTP/1.1 protocol (httptools) with a bound on the time a request's head may
take. uvicorn closes an idle kept-alive connection only if no byte at all arrives (its
keep-alive timer is armed after an answer and cancelled by the first byte), and arms
nothing on a new connection: a client that connects and sends nothing, or one byte of
a request line, held its socket for good. Here a connection whose request line and
headers are not all in within the server's keep-alive (gunicorn's `keepalive`, 20 s)
of its opening, or of its last answer, is closed. gunicorn's threaded worker, which
served before, closed a silent connection after its keep-alive too.

A request's body is due within LAKESHORE_BODY_SECONDS of its head (the same class of
bound, for the bytes after the head): a body that has not all arrived by then is
answered 408 `body_timeout` and its connection closed, unless the application has
begun its answer (it needs no more of the body). The application receives a body on
the event loop before a thread serves the request (edge/application.py), so a
body that never comes holds a socket for that long, never a thread. The timer is
armed only when a body is still arriving once the bytes at hand are parsed: a request
whose body comes with its head (the daemon protocol's) costs nothing more.

It relies on the attributes uvicorn's protocol class sets for itself (`loop`,
`transport`, `timeout_keep_alive`, `timeout_keep_alive_task`, `cycle`, `scope`,
`access_logger`) and its request cycle's (`more_body`, `response_started`,
`response_complete`, `disconnected`, `message_event`) in the pinned version
(requirements.txt); tests/edge/test_slow_head.py and test_body_deadline.py check
it on the real server."""

import asyncio
from types import SimpleNamespace

from django.conf import settings
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from lakeshore_admin.api_errors import error_response


class Protocol(HttpToolsProtocol):
    head_deadline: asyncio.TimerHandle | None = None
    body_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.body_deadline is None and self._body_pending():
            self.body_deadline = self.loop.call_later(
                settings.LAKESHORE_BODY_SECONDS, self._body_late
            )

    def _body_pending(self) -> bool:
        """A request's head has come, its body not all of it, and it is not answered."""
        cycle = self.cycle
        return (
            cycle is not None
            and cycle.more_body
            and not cycle.response_complete
            and not self.transport.is_closing()
        )

    def on_headers_complete(self) -> None:
        self._head_arrived()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._body_arrived()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._body_arrived()  # answered: the rest of its body is only skipped
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:  # idle now: the next head is due
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        self._body_arrived()
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

    def _body_arrived(self) -> None:
        if self.body_deadline is not None:
            self.body_deadline.cancel()
            self.body_deadline = None

    def _body_late(self) -> None:
        """The body is late: 408, unless the application has begun its answer, and the
        connection closed. The application's receive then says the client went
        (http.disconnect), and what it would still send is dropped."""
        self.body_deadline = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or cycle.response_started:
            return
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.write(_late_answer(self.scope.get("path", "")))
        self.transport.close()
        if self.access_log:
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(self.scope),
                self.scope["method"],
                get_path_with_query_string(self.scope),
                self.scope["http_version"],
                408,
            )


def _late_answer(path: str) -> bytes:
    """A 408 as the site answers its errors (the API's body under /api/, the SDK's line
    under /v1/, a small page elsewhere), ready to write, closing the connection."""
    seconds = settings.LAKESHORE_BODY_SECONDS
    message = (
        f"The request body did not arrive within {seconds:g} s of its headers "
        "(LAKESHORE_BODY_SECONDS)."
    )
    response = error_response(
        SimpleNamespace(path=path), 408, "body_timeout", message, "Request Timeout (408)"
    )
    head = [STATUS_LINE[408]]
    for name, value in response.items():
        head.append(f"{name}: {value}\r\n".encode("latin-1"))
    head.append(f"Content-Length: {len(response.content)}\r\n".encode())
    head.append(b"Connection: close\r\n\r\n")
    return b"".join(head) + response.content
