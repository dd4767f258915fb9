"""The ASGI server's doors (edge/application.py) for the other requests that wait:
the SDK's await and result stream, and a job log's follow (the routes
jobs/api/routes.py declares with the doors "await", "stream" and "follow"). Each runs as steps
(jobs/waits.py): each step in a worker thread (they touch the database), each wait a
coroutine on the event loop, holding no thread.

    POST /v1/namespaces/<ns>/producer/await                           jobs/sdk.await_steps
    GET  /v1/namespaces/<ns>/producer/invocations/<id>/result/stream  jobs/sdk.frame_steps
    GET  /api/v1/jobs/<id>/logs/?follow=…                            jobs/logs.read_steps

A door takes a request once admitted (edge/admission.py: the request line and headers,
a bearer token with the view's role, before a byte of the body is read); a log read
also only when its answer is plain JSON (no `format`, an Accept that JSONRenderer
answers as it is). Then it parses the body and the query and runs the first step; if
any of that fails, the whole request goes to the full stack (its body given again),
which answers as it always has: the errors, a bad `since`, an unknown invocation.

These waits are parked on the listening connection (jobs/wakeup.py): an SDK
invocation's end, a result frame and a log's next line are notified and wake them at
once; between, they look again after a pause (every 2 s for what is notified; 20 ms
growing to 250 ms for the end of a REST API invocation, 500 ms for the end of a
follow's attempt): each look is one step in a worker thread, held only for its
queries. A stopping server (asgi.py ends every wait) answers an await or a follow with
what it last read, and cuts a stream short (the SDK raises rather than take the stream
for complete).

The result stream is sent as it is read: each read of frames (at most
LAKESHORE_SDK_STREAM_READ_BYTES, or one larger frame) one `http.response.body` with
`more_body`, sent only as fast as the client takes it, so a stream holds at most one
read in memory. It ends as the thread path's ends (a final frame, its invocation ended,
LAKESHORE_SDK_STREAM_IDLE_SECONDS without a frame), or when the client goes. An open
stream counts as one of LAKESHORE_MAX_PARKED the whole time it is open; with none left,
it goes to the full stack (a thread, within LAKESHORE_MAX_WAITS, or 503 `busy`). An
await's and a follow's waits are counted as a claim's are (waits.drive_async)."""

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable

from django.core.handlers.wsgi import get_str_from_wsgi
from django.http import QueryDict
from rest_framework.renderers import JSONRenderer

from edge.admission import admit
from edge.lean_path import allow
from edge.messages import parse_msgpack
from jobs import logs, sdk, waits, wakeup
from jobs.api import serializers
from jobs.api.sdk_views import STREAM_MEDIA_TYPE
from jobs.api.views import JobLogs
from lakeshore_admin.api_errors import exception_handler as api_exception_handler
from lakeshore_admin.api_errors import sdk_answer, sdk_error
from lakeshore_admin.msgpack_api import MEDIA_TYPE, MsgPackRenderer

JSON_ACCEPTS = {"", "*/*", "application/*", "application/json"}


# ---------------------------------------------------------------------------- await


async def await_door(app, route, arguments, environ, scope, receive, send):
    admitted = await admit(app, route, arguments, environ, scope, receive, send)
    if admitted is None:
        return None
    request = admitted.request
    run = functools.partial(app.run, request)
    try:
        data = await app.run(None, parse_msgpack, environ, admitted.body)
        sdk.check_namespace(arguments["namespace"])
        steps = sdk.await_steps(data)
        first = await run(waits.first_step, steps)
    except Exception:  # noqa: BLE001 - the full stack answers it as it always has
        await app.finished()
        return await app.full_stack(scope, receive, send, admitted.body)
    try:
        answer = await waits.drive_async(steps, run, first=first, who=waits.principal(request))
    except Exception as exc:  # noqa: BLE001 - the view's error answer (a gone invocation)
        response = await run(_sdk_error, exc, request)
        await app.finished()
        return await app.answer_response(send, response, secure=admitted.secure, view=route.view)
    await app.finished()
    content = MsgPackRenderer().render(answer)
    await app.answer(
        send, 200, content, content_type=MEDIA_TYPE, secure=admitted.secure, view=route.view
    )


def _sdk_error(exc, request):
    """An error raised after the first step, answered as an SDK view answers it."""
    response = api_exception_handler(exc, {"request": request, "view": None})
    if response is None:  # Django's 500 for the SDK: one line of text
        return sdk_error(500, "server_error", "The server failed; the error was logged.")
    return sdk_answer(response)


# ---------------------------------------------------------------------------- result stream


async def stream_door(app, route, arguments, environ, scope, receive, send):
    admitted = await admit(app, route, arguments, environ, scope, receive, send)
    if admitted is None:
        return None
    request = admitted.request
    who = waits.principal(request)
    if not waits.parked.take(who):  # no room to park: a thread serves it, or says busy
        await app.finished()
        return await app.full_stack(scope, receive, send)
    run = functools.partial(app.run, request)
    steps = None
    try:
        namespace, stream = arguments["namespace"], arguments["stream"]
        query = QueryDict(get_str_from_wsgi(environ, "QUERY_STRING", ""))
        since = sdk.stream_start(namespace, stream, query.get("since", "-1"))
        steps = sdk.frame_steps(stream, since)
        got = await run(_next, steps)
    except Exception:  # noqa: BLE001 - the full stack answers it as it always has
        waits.parked.release(who)
        if steps is not None:
            await run(steps.close)
        await app.finished()
        return await app.full_stack(scope, receive, send)
    try:
        headers = app.lean.headers(
            200,
            STREAM_MEDIA_TYPE,
            None,  # it streams: no length
            allow=allow(route.view),
            secure=admitted.secure,
            extra=(("Cache-Control", "no-store"), ("X-Accel-Buffering", "no")),
        )
        await respond_stream(send, headers, _chunks(got, steps, run, receive))
    finally:
        waits.parked.release(who)
        await run(steps.close)
        await app.finished()


def _next(steps):
    """The steps' next step, in a worker thread: (True, None) when they end."""
    try:
        return False, next(steps)
    except StopIteration:
        return True, None


class Cut(Exception):
    """The stream stops without its end: the server is stopping (the client sees it
    broken, not complete), or the client went."""


async def _chunks(got, steps, run, receive):
    """The stream's chunks (bytes), parked between them; ends when the steps end;
    raises Cut when the server stops or the client goes."""
    gone = asyncio.ensure_future(_disconnect(receive))
    try:
        done, step = got
        while not done:
            if gone.done():
                raise Cut
            if isinstance(step, waits.Wait):
                if wakeup.listener.closing:
                    raise Cut
                waiting = asyncio.ensure_future(
                    wakeup.listener.wait_async(step.queues, step.seen, step.seconds)
                )
                await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
                if gone.done():
                    waiting.cancel()
                    raise Cut
                if wakeup.listener.closing:
                    raise Cut
            else:
                yield b"".join(step)
            done, step = await run(_next, steps)
    finally:
        gone.cancel()


async def _disconnect(receive) -> None:
    """Returns when the client has gone (a GET's body, empty, comes first)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def respond_stream(send, headers, chunks) -> None:
    """A streamed answer: its headers, then each chunk as it comes (`more_body`), then
    its end; a Cut ends it with no end (the client sees the stream broken)."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(k.lower().encode("latin1"), v.encode("latin1")) for k, v in headers],
        }
    )
    try:
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except Cut:
        return
    await send({"type": "http.response.body", "body": b"", "more_body": False})


# ---------------------------------------------------------------------------- log follow


async def follow_door(app, route, arguments, environ, scope, receive, send):
    query = QueryDict(get_str_from_wsgi(environ, "QUERY_STRING", ""))
    if "follow" not in query or not _plain_json(environ, query):
        return await app.full_stack(scope, receive, send)
    admitted = await admit(app, route, arguments, environ, scope, receive, send)
    if admitted is None:
        return None
    request = admitted.request
    run = functools.partial(app.run, request)
    try:
        steps, first = await run(_follow_steps, arguments["invocation_id"], query.dict())
    except Exception:  # noqa: BLE001 - the full stack answers it as it always has
        await app.finished()
        return await app.full_stack(scope, receive, send)
    try:
        page = await waits.drive_async(steps, run, first=first, who=waits.principal(request))
        outcome = (serializers.LogPage(page).data, 200, ())
    except Exception as exc:  # noqa: BLE001 - the API's error body, as the lean path's
        outcome = await run(app.lean.error, exc, request)
    finally:
        await app.finished()
    await app.answer_outcome(send, outcome, admitted.secure, route.view)


def _plain_json(environ, query) -> bool:
    """DRF would answer this read with JSONRenderer alone, as it renders by default:
    one renderer, no `format`, and an Accept it takes as it is (no indent)."""
    if "format" in query:
        return False
    if [type(renderer) for renderer in JobLogs().get_renderers()] != [JSONRenderer]:
        return False  # DEBUG's browsable API: DRF varies on Accept
    accepts = [part.strip() for part in environ.get("HTTP_ACCEPT", "").split(",")]
    return all(part.lower() in JSON_ACCEPTS for part in accepts)


def _follow_steps(invocation_id, params: dict):
    """(the read's steps, its first step): the query checked as the view checks it."""
    query = serializers.LogQuery(data=params)
    query.is_valid(raise_exception=True)
    steps = logs.read_steps(invocation_id, **query.validated_data)
    return steps, waits.first_step(steps)


# the doors by the name the apps' routes give them (jobs/api/routes.py)
DOORS: dict[str, Callable[..., Awaitable[object]]] = {
    "await": await_door,
    "stream": stream_door,
    "follow": follow_door,
}
