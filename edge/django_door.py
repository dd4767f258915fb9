"""Django's full stack served from the event loop: each request runs Django's WSGI
handler (its middleware, URL resolving, the view) in a worker thread, given its whole
body, received on the loop beforehand (edge/application.py).

An answer whose content is in hand (every answer but a streamed one) comes back to the
loop whole and is sent from there. A streamed answer (a log's text, an export) is sent
chunk by chunk from its thread, each chunk once the loop has taken the one before, so a
stream holds one chunk in memory. A request whose body was not received (Django
answers it without: a stranger's, one past its type's limit) reads as a broken
connection's would (Withheld), never as an empty body.

A view may park its wait (jobs/waits.PARKING: the request's Parking, edge/parking.py).
Its answer then is a placeholder that went through the middleware like any other; it
is not sent: the edge keeps the headers the middleware gave it and answers when the
wait is over."""

import asyncio
import contextvars
import io
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from edge.messages import Withheld, wsgi_environ
from edge.parking import Parking
from jobs import waits


class WithheldBody(io.RawIOBase):
    """The wsgi.input of a request whose body was not received: reading it fails."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        raise Withheld("the request body was not received")


@dataclass
class Answer:
    """What Django answered: its status and headers (ASGI's: lower-case bytes), and
    its content when it came whole (None when it was streamed: already sent)."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    content: bytes | None = None


class DjangoDoor:
    """`app` (Django's WSGI handler) in the threads of `executor`."""

    def __init__(self, app: Callable, executor: Executor):
        self.app = app
        self.executor = executor

    async def __call__(self, scope, body: bytes | None, send, parking: Parking | None = None):
        """Serve the request and send Django's answer, unless its view parked it
        (then `parking` holds the wait and the answer's headers)."""
        environ = wsgi_environ(scope, io.BytesIO(body) if body is not None else WithheldBody())
        environ[waits.ARRIVED] = time.monotonic()  # a wait counts from now, not its thread's turn
        if parking is not None:
            environ[waits.PARKING] = parking
        loop = asyncio.get_running_loop()

        def send_from_thread(message) -> None:
            asyncio.run_coroutine_threadsafe(send(message), loop).result()

        serve = contextvars.copy_context().run  # the request's context (dbpool.share)
        answer = await loop.run_in_executor(
            self.executor, serve, self._serve, environ, send_from_thread, parking
        )
        if answer.content is not None and (parking is None or parking.parked is None):
            await send(
                {"type": "http.response.start", "status": answer.status, "headers": answer.headers}
            )
            await send({"type": "http.response.body", "body": answer.content})

    def _serve(self, environ, send_from_thread, parking: Parking | None) -> Answer:
        answer = Answer()

        def start_response(status: str, headers, exc_info=None):
            answer.status = int(status.split(" ", 1)[0])
            answer.headers = [
                (name.lower().encode("latin1"), value.encode("latin1")) for name, value in headers
            ]
            return lambda chunk: None  # the write() callable: Django never calls it

        response = self.app(environ, start_response)
        try:
            if parking is not None and parking.parked is not None:
                parking.headers = answer.headers  # the middleware's, for the answer to come
                return answer
            if not getattr(response, "streaming", False):
                answer.content = b"".join(response)
                return answer
            start = {"type": "http.response.start", "status": answer.status}
            send_from_thread({**start, "headers": answer.headers})
            for chunk in response:
                if chunk:
                    send_from_thread(
                        {"type": "http.response.body", "body": chunk, "more_body": True}
                    )
            send_from_thread({"type": "http.response.body", "body": b""})
            return answer
        finally:
            close = getattr(response, "close", None)
            if close is not None:
                close()  # request_finished: the thread's database connections go back
