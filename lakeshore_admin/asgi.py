"""The web server's application: ASGI, what `make run` and production serve (gunicorn's
uvicorn workers: gunicorn_conf.py), so that an idle daemon's long-poll holds no thread.

An idle daemon's claim waits up to 20 s for work. Under a threaded WSGI server each of
those waits held a thread, so a server answered at most as many idle daemons at once
as it had threads. Here:

- POST /api/v1/daemons/ID/claim/ and …/exchange/, when the lean path takes them
  (lakeshore_admin/fastpath.py: its checks of the request line and headers): the token
  and role are checked in a worker thread, the body is read only then, and the answer
  runs as steps (jobs/waits.py): each step in a worker thread (they touch the
  database), each wait a coroutine on this event loop, holding no thread. The answers,
  headers and errors are the lean path's own.
- everything else (console, API, submit, heartbeats, the SDK): the WSGI application
  (the lean path, then Django) on a bounded pool of LAKESHORE_WEB_THREADS threads per
  process (a2wsgi), as gunicorn's threads served it before.

A server stopping (SIGTERM, SIGINT, SIGQUIT) ends every parked wait at once: its claim
answers empty, and the daemon claims again (from another server, or this one when it is
back)."""

import asyncio
import functools
import io
import signal
from concurrent.futures import ThreadPoolExecutor

from a2wsgi import WSGIMiddleware
from a2wsgi.wsgi import build_environ
from django.conf import settings
from django.core import signals
from django.db import close_old_connections

from lakeshore_admin.wsgi import application as lean  # sets Django up: before the apps

# isort: split
from accounts import audit
from fleet.api import protocol
from jobs import waits, wakeup
from lakeshore_admin.fastpath import TO_DJANGO, allow, read_body

STEPPED = {"claim": protocol.claim_answer_steps, "exchange": protocol.exchange_answer_steps}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


class Disconnected(Exception):
    """The client went away before its body arrived."""


class Application:
    def __init__(self, threads: int):
        self.steps = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lakeshore-step")
        self.wsgi = WSGIMiddleware(lean, workers=threads)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.lifespan(receive, send)
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"].endswith(("/claim/", "/exchange/"))
        ):
            environ = build_environ(scope, io.BytesIO())
            taken = lean.take(environ)
            if taken is not None and taken[0] in STEPPED:
                return await self.long_poll(environ, taken, scope, receive, send)
        return await self.wsgi(scope, _coroutine(receive), send)

    async def run(self, request, fn, *args):
        """fn(*args) in a worker thread, acting for `request` (the audit trail), its
        database connection given back when it returns."""

        def call():
            try:
                if request is None:
                    return fn(*args)
                with audit.serving(request):
                    return fn(*args)
            finally:
                close_old_connections()

        return await asyncio.get_running_loop().run_in_executor(self.steps, call)

    async def long_poll(self, environ, taken, scope, receive, send):
        admitted = await self.run(None, lean.admit, environ, taken)
        if admitted is None:  # refused: Django answers, and says why (the body unread)
            return await self.wsgi(scope, _coroutine(receive), send)
        request, view, answer_steps = admitted
        route, args, secure = taken
        try:
            body = await _read(receive)
        except Disconnected:
            await self.run(None, signals.request_finished.send, Application)
            return
        environ["wsgi.input"] = io.BytesIO(body)
        data = await self.run(None, read_body, environ)
        if data is TO_DJANGO:  # DRF's parser answers it
            return await self.wsgi(scope, _replay(body, receive), send)
        try:
            steps = STEPPED[route](request, *args, data)
            payload, status, *headers = await waits.drive_async(
                steps, functools.partial(self.run, request)
            )
            outcome = (payload, status, tuple(headers[0].items()) if headers else ())
        except Exception as exc:  # noqa: BLE001 - the API's error body, as the lean path's
            outcome = await self.run(request, lean.error, exc, request)
        finally:
            await self.run(None, signals.request_finished.send, Application)
        status, headers, content = lean.rendered(outcome, secure, allow(view))
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(k.lower().encode("latin1"), v.encode("latin1")) for k, v in headers],
            }
        )
        await send({"type": "http.response.body", "body": content})

    async def lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _release_waits_on_stop()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                wakeup.listener.close_waits()
                self.steps.shutdown(wait=False)
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _read(receive) -> bytes:
    """The whole body (the lean path checked its Content-Length against Django's
    limit, and the server holds the client to it)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _coroutine(receive):
    """`receive` as a coroutine function, which a2wsgi needs (granian's is not one)."""

    async def coroutine():
        return await receive()

    return coroutine


def _replay(body: bytes, receive):
    """A receive that gives the body read once more, then the client's messages."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _release_waits_on_stop() -> None:
    """On a stop signal, end every parked wait before the server waits for its open
    requests (each would otherwise hold the stop up to its 20 s), then do what the
    server's own handler does. The event loop runs in the main thread at startup."""
    for number in STOP_SIGNALS:
        previous = signal.getsignal(number)
        if not callable(previous):
            continue

        def handler(signum, frame, previous=previous):
            wakeup.listener.close_waits()
            previous(signum, frame)

        signal.signal(number, handler)


application = Application(threads=settings.LAKESHORE_WEB_THREADS)
