"""The web server's application: ASGI, what `make run` and production serve (gunicorn's
uvicorn workers: gunicorn_conf.py), so that an idle daemon's long-poll holds no thread.

An idle daemon's claim waits up to 50 s for work. Under a threaded WSGI server each of
those waits held a thread, so a server answered at most as many idle daemons at once
as it had threads. Here:

- POST /api/v1/daemons/ID/claim/ and …/exchange/, when the lean path takes them
  (edge/lean_path.py: its checks of the request line and headers): the token
  and role are checked (on this loop when the process keeps the token, else in a
  worker thread), the body is read only then, and the answer runs as steps
  (jobs/waits.py): each step in a worker thread (they touch the database), each wait a
  coroutine on this event loop, holding no thread. The answers, headers and errors are
  the lean path's own.
- a submit (POST /api/v1/jobs/), a daemon's heartbeat and completion, when the lean
  path takes them: the same admission, then the answer in one worker-thread turn,
  without the WSGI bridge's turns.
- POST /v1/daemon/poll, the SDK worker's poll, the same way (edge/sdk_poll.py).
- the SDK's await and result stream, and a job log's follow (edge/streams.py).
- everything else (console, API, the SDK's producer): the WSGI application (the lean
  path, then Django) on a bounded pool of LAKESHORE_WEB_THREADS threads per process
  (edge/django_door.py), as gunicorn's threads served it before (full_stack); a view
  that long-polls parks its wait on this loop (edge/parking.py). Its body is received
  on this loop first, within LAKESHORE_BODY_SECONDS of its head (past it the server
  answers 408: http_protocol.py), so a thread is given only to a request whose body is
  all here: a body that never comes holds a socket, never a thread. A multipart body
  is refused (415) before a byte of it is read: nothing here takes file uploads.

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
from edge import sdk_poll as sdk_door
from edge import streams as streams_door
from edge.django_door import DjangoDoor
from edge.lean_path import ASK_IN_THREAD, TO_DJANGO, allow, read_body
from edge.messages import (
    Bodies,
    Disconnected,
    OverBudget,
    body_head,
    gone_when_closed,
    read_all,
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
        if route.door == "lean":  # the daemon protocol, a submit
            environ = wsgi_environ(scope, io.BytesIO())
            environ[waits.ARRIVED] = time.monotonic()  # a wait counts from now
            taken = self.lean.take(environ)
            if taken is not None:
                return await self.lean_door(environ, taken, scope, receive, send)
        elif route.door == "sdk-poll":
            environ = wsgi_environ(scope, io.BytesIO())
            if (allowed := self.lean.headers_allow(environ, MEDIA_TYPE)) is not None:
                secure = allowed[1]
                return await sdk_door.poll(self, environ, scope, receive, send, secure=secure)
        else:  # the SDK's await and stream, a follow
            return await streams_door.DOORS[route.door](self, scope, receive, send, **arguments)
        return await self.full_stack(scope, receive, send)

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
        headers = [*response.items(), ("Content-Length", str(len(response.content)))]
        if retry_after is not None:
            headers.append(("Retry-After", retry_after))
        await respond(send, status, [*headers, *self.lean.static_headers()], response.content)

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

    async def lean_door(self, environ, taken, scope, receive, send):
        """What the lean path answers, without the WSGI bridge. The token is checked
        first, the body unread: on this loop when the process keeps the token, else in
        a worker thread; then whether it may speak for the daemon of the path (on this
        loop when that takes no query). Then the body is read here, and the answer
        runs: a claim's or an exchange's as steps (a turn in a worker thread for its
        first step, its wait on this loop, its last step in a thread unless the wait ran
        out: answered), any other (a submit, a heartbeat, a completion) in one
        worker-thread turn. The response is sent from here."""
        lean = self.lean
        admitted = lean.admit_kept(environ, taken)  # a token this process keeps: no query
        if admitted is None:
            admitted = await self.run(None, lean.admit, environ, taken)
        if admitted is None:  # refused: Django answers, and says why (the body unread)
            return await self.full_stack(scope, receive, send, refused=True)
        request, view, answer = admitted
        route, args, secure = taken
        refused = lean.refused_before_body(request, taken, known_only=True)
        if refused is ASK_IN_THREAD:
            refused = await self.run(None, lean.refused_before_body, request, taken)
        if refused is not None:  # not its daemon: answered, the body unread
            await self.run(None, signals.request_finished.send, Application)
            status, headers, content = lean.rendered(refused, secure, allow(view))
            return await respond(send, status, headers, content)
        try:
            body = await read_all(receive)
        except Disconnected:
            await self.run(None, signals.request_finished.send, Application)
            return
        environ["wsgi.input"] = io.BytesIO(body)
        if route.steps is not None:
            try:
                outcome = await self.long_poll(request, route.steps, args, environ, receive)
            except waits.Gone:  # the daemon went while it waited: nobody to answer
                return
        else:
            outcome = await self.run(None, _answer_once, lean, request, answer, args, environ)
        if outcome is TO_DJANGO:  # DRF's parser answers it
            return await self.full_stack(scope, receive, send, body)
        status, headers, content = lean.rendered(outcome, secure, allow(view))
        await respond(send, status, headers, content)

    async def long_poll(self, request, answer_steps, args, environ, receive):
        """A claim's or an exchange's outcome: its steps driven on this loop, closed
        where they wait if the client goes (waits.Gone)."""
        steps = self.answered(request, answer_steps, args, environ)
        gone = gone_when_closed(receive)
        try:
            return await waits.drive_async(
                steps,
                functools.partial(self.run, request),
                gone=gone,
                who=waits.principal(request),
            )
        finally:
            gone.cancel()

    def answered(self, request, answer_steps, args, environ):
        """The request's outcome, (payload, status, extra headers), as steps: its body
        read, then the answer's steps, its errors answered as the lean path's; or
        TO_DJANGO. No request_finished: its receivers give back the calling thread's
        database connections, which each step's turn in a worker thread does (run),
        and the last step of a wait that ran out runs on the event loop, which holds
        none."""
        try:
            data = read_body(environ)
            if data is TO_DJANGO:
                return TO_DJANGO
            payload, status, *headers = yield from answer_steps(request, *args, data)
            return payload, status, tuple(headers[0].items()) if headers else ()
        except Exception as exc:  # noqa: BLE001 - the API's error body, as the lean path's
            return self.lean.error(exc, request)

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


def _answer_once(lean, request, answer, args, environ):
    """The lean path's outcome of a request whose body is in `environ` (its errors
    answered as the API's views answer them), or TO_DJANGO; the request ends here."""
    data = read_body(environ)
    if data is TO_DJANGO:
        signals.request_finished.send(sender=Application)
        return TO_DJANGO
    return lean.outcome(request, lambda: answer(request, *args, data))


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


def build(wsgi_application) -> Application:
    """The application serving `wsgi_application` (the lean path in front of Django:
    lakeshore_admin/wsgi.py) for what takes no door of its own."""
    return Application(wsgi_application, threads=settings.LAKESHORE_WEB_THREADS)
