"""The web server's application: ASGI, what `make run` and production serve (gunicorn's
uvicorn workers: gunicorn_conf.py), so that an idle daemon's long-poll holds no thread.

An idle daemon's claim waits up to 50 s for work. Under a threaded WSGI server each of
those waits held a thread, so a server answered at most as many idle daemons at once
as it had threads. Here a request on a hot route the apps declare (edge/routes.py)
goes to its door (DOORS), which admits it (edge/admission.py: headers, token and role,
the caller, then the body) and answers it on this event loop: each step of its answer
in a worker thread (they touch the database), each wait a coroutine, holding no
thread:

- "lean" (edge/lean_door.py): a daemon's claim, exchange, completion and heartbeat, a
  submit; the lean path's answers (edge/lean_path.py);
- "sdk-poll" (edge/sdk_poll.py): the SDK worker's poll;
- "await", "stream", "follow" (edge/streams.py): the SDK's await and result stream, a
  job log's follow.

Everything else (console, API, the SDK's producer), and whatever a door does not admit:
the WSGI application (the lean path, then Django) on a bounded pool of
LAKESHORE_WEB_THREADS threads per process (edge/django_door.py); a view that long-polls
parks its wait on this loop (edge/parking.py). Its body is received on this loop first,
within LAKESHORE_BODY_SECONDS of its head (past it the server answers 408:
http_protocol.py), so a thread is given only to a request whose body is all here: a
body that never comes holds a socket, never a thread. A multipart body is refused (415)
before a byte of it is read: nothing here takes file uploads. Every answer sent from
here carries the headers the middleware would add (Application.answer).

A server stopping (SIGTERM, SIGINT, SIGQUIT) ends every parked wait at once: its claim
answers empty, and the daemon claims again (from another server, or this one when it is
back)."""

import asyncio
import contextvars
import functools
import io
import logging
import signal
import time
from http import HTTPStatus
from types import SimpleNamespace

from django.conf import settings
from django.core import signals
from django.db import close_old_connections
from rest_framework.exceptions import AuthenticationFailed

from accounts import audit
from accounts.authentication import authenticate_token, kept_token
from edge import lean_door, sdk_poll, streams
from edge.django_door import DjangoDoor
from edge.lean_path import allow, is_secure
from edge.messages import (
    Bodies,
    Disconnected,
    OverBudget,
    body_head,
    gone_when_closed,
    respond,
    wsgi_environ,
)
from edge.parking import Parked, Parking
from edge.routes import hot_route
from edge.threads import HotFirstExecutor
from jobs import waits, wakeup
from lakeshore_admin import dbpool
from lakeshore_admin.api_errors import error_response
from lakeshore_admin.msgpack_api import MEDIA_TYPE, body_limit

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
log = logging.getLogger("django.request")


class Application:
    """`lean`: the WSGI application (the lean path, edge/lean_path.py, in front
    of Django)."""

    def __init__(self, lean, threads: int):
        self.lean = lean
        self.steps = HotFirstExecutor(threads, thread_name_prefix="lakeshore-step")
        # its pool too hands each request to the thread that finished last (threads.py)
        self.django = DjangoDoor(lean, HotFirstExecutor(threads, thread_name_prefix="WSGI"))
        # bodies received for the full stack, not yet answered
        self.bodies = Bodies(lambda: settings.LAKESHORE_BODY_BUFFER_BYTES)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.lifespan(receive, send)
        if scope["type"] == "http":  # its share of the database pool (dbpool.py)
            dbpool.share.set(dbpool.share_of(scope["path"]))
        found = hot_route(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if found is None:
            return await self.full_stack(scope, receive, send)
        route, arguments = found
        environ = wsgi_environ(scope, io.BytesIO())
        environ[waits.ARRIVED] = time.monotonic()  # a wait counts from now
        return await DOORS[route.door](self, route, arguments, environ, scope, receive, send)

    async def full_stack(self, scope, receive, send, body=None, *, refused=False):
        """The WSGI application answers in a thread of its pool, given the whole body:
        `body` when a door has read it, else the body received here first, on this loop.
        None is received when Django answers without it: a multipart body (415 here),
        a body with no length (Django reads none), a request whose bearer token is
        refused (`refused`: a door checked it; DRF refuses before its parsers run) or
        whose length is past its type's limit (Django answers 413 from the length):
        for these two a read of the body fails (django_door.WithheldBody), never finds it
        empty. Past the bodies this process may hold (LAKESHORE_BODY_BUFFER_BYTES:
        asgi_io.Bodies), 503 busy here, the rest unread."""
        if body is not None:
            return await self.serve(scope, body, receive, send)
        media_type, length, bearer = body_head(scope)
        if media_type.startswith("multipart/"):
            message = (
                "Multipart bodies are not taken: nothing here takes file uploads "
                "(forms post application/x-www-form-urlencoded, the API JSON)."
            )
            return await self.refuse(scope, send, 415, "unsupported_media_type", message)
        if not length:  # none, or no length: Django reads nothing
            return await self.serve(scope, b"", receive, send)
        if refused or length > largest_body(media_type):
            return await self.serve(scope, None, receive, send)
        if bearer is not None and not await self.authenticates(bearer):
            return await self.serve(scope, None, receive, send)
        try:
            body, held = await self.bodies.read(receive, length)
        except Disconnected:  # the client went, or its body was late (408 sent)
            return None
        except OverBudget:
            message = "The server holds as many request bodies as it may; try again shortly."
            return await self.refuse(scope, send, 503, "busy", message, retry_after="1")
        try:
            return await self.serve(scope, body, receive, send)
        finally:
            self.bodies.release(held)

    async def serve(self, scope, body: bytes | None, receive, send):
        """Django's answer (edge/django_door.py), given the whole body (None: not
        received); a wait its view parked (edge/parking.py) is driven here, then
        answered."""
        parking = Parking()
        await self.django(scope, body, send, parking)
        if parking.parked is not None:
            await self.answer_parked(parking, parking.parked, scope, receive, send)

    async def answer_parked(self, parking: Parking, parked: Parked, scope, receive, send):
        """Drive the parked steps on this loop (each step in a worker thread, each wait
        a coroutine), closed where they wait if the client goes; then the view renders
        the answer (in a worker thread) and it is sent with the middleware's headers."""
        run = functools.partial(self.run, parked.request)
        gone = gone_when_closed(receive)
        value = error = None
        try:
            value = await waits.drive_async(
                parked.steps,
                run,
                first=parked.wait,
                gone=gone,
                who=waits.principal(parked.request),
            )
        except waits.Gone:  # the client went while it waited: nobody to answer
            return
        except Exception as exc:  # noqa: BLE001 - the view answers it, as DRF would
            error = exc
        finally:
            gone.cancel()
        try:
            response = await run(parked.finish, value, error)
        except Exception:  # noqa: BLE001 - not the API's kind of error: a 500, logged
            log.exception("Internal Server Error: %s", scope["path"])
            message = "The server failed; the error was logged."
            return await self.refuse(scope, send, 500, "server_error", message)
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": parking.headers_for(response),
            }
        )
        await send({"type": "http.response.body", "body": response.content})

    async def authenticates(self, bearer: str) -> bool:
        """Whether a bearer token authenticates (no query when this process keeps it)."""
        if kept_token(bearer) is not None:
            return True
        try:
            await self.run(None, authenticate_token, bearer)
        except AuthenticationFailed:
            return False
        except Exception:  # noqa: BLE001 - the database: the body is taken, Django answers
            return True
        return True

    async def refuse(self, scope, send, status, code, message, *, retry_after=None):
        """An error answered here, as the site answers its own (the API's error body
        under /api/, the SDK's line under /v1/, a small page elsewhere), the body
        unread; the connection stays open for the client's next request."""
        title = f"{HTTPStatus(status).phrase} ({status})"
        response = error_response(SimpleNamespace(path=scope["path"]), status, code, message, title)
        extra = () if retry_after is None else (("Retry-After", retry_after),)
        secure = is_secure(wsgi_environ(scope, io.BytesIO()))
        await self.answer_response(send, response, secure=secure, view=None, extra=extra)

    async def answer(self, send, status, content, *, content_type, secure, view=None, extra=()):
        """Send a whole answer from a door, with every header it takes (edge/lean_path.
        LeanPath.headers: the middleware's, and the Allow of `view` unless None)."""
        headers = self.lean.headers(
            status,
            content_type,
            len(content),
            allow=None if view is None else allow(view),
            secure=secure,
            extra=extra,
        )
        await respond(send, status, headers, content)

    async def answer_outcome(self, send, outcome, secure, view):
        """An outcome (payload, status, extra headers), rendered as the API's JSON."""
        status, headers, content = self.lean.rendered(outcome, secure, allow(view))
        await respond(send, status, headers, content)

    async def answer_response(self, send, response, *, secure, view, extra=()):
        """A Django response a door rendered (an error body)."""
        own = tuple((k, v) for k, v in response.items() if k.lower() != "content-type")
        await self.answer(
            send,
            response.status_code,
            response.content,
            content_type=response["Content-Type"],
            secure=secure,
            view=view,
            extra=(*own, *extra),
        )

    async def finished(self) -> None:
        """Django's request_finished, in a worker thread: a door's request ends."""
        await self.run(None, signals.request_finished.send, Application)

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

        # in the request's context: its share of the database pool (dbpool.share)
        in_context = contextvars.copy_context().run
        return await asyncio.get_running_loop().run_in_executor(self.steps, in_context, call)

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


def largest_body(media_type: str) -> int:
    """The largest body of this type a route takes: the SDK's msgpack limit, or
    Django's (DATA_UPLOAD_MAX_MEMORY_SIZE)."""
    return body_limit() if media_type == MEDIA_TYPE else settings.DATA_UPLOAD_MAX_MEMORY_SIZE


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


# the edge's doors, by the name the apps' routes give them (edge/routes.py)
DOORS = {"lean": lean_door.door, "sdk-poll": sdk_poll.poll, **streams.DOORS}


def build(wsgi_application) -> Application:
    """The application serving `wsgi_application` (the lean path in front of Django:
    lakeshore_admin/wsgi.py) for what takes no door of its own."""
    return Application(wsgi_application, threads=settings.LAKESHORE_WEB_THREADS)
