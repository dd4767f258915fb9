"""The SDK worker's poll through the ASGI server (edge/application.py): POST
/v1/daemon/poll (fleet/api/routes.py, door "sdk-poll"), a long-poll of up to a second
that every idle SDK worker repeats, is served as steps (fleet/sdk_worker.poll_steps):
each step in a worker thread, the wait parked on the event loop, holding no thread.

It takes a poll only when the lean path's checks of the request line and headers pass
(edge/lean_path.py, for a msgpack body), and its bearer token authenticates
with the view's role, before a byte of the body is read. Then it reads and parses the
body and runs the first step; if any of that fails, the whole request goes to the full
stack with its body given again, which answers as it always has (the SDK's one line of
text). Once parked, a database that goes away answers no work after a pause, as the
view does (fleet/api/sdk_worker.py): any error would end the SDK's worker."""

import asyncio
import functools
import logging

from django.core import signals
from django.db import InterfaceError, OperationalError

from edge.lean_path import allow
from edge.messages import Disconnected, parse_msgpack, read_all, respond
from fleet import sdk_worker
from fleet.api.sdk_worker import DaemonPoll
from jobs import waits
from lakeshore_admin.api_errors import sdk_error
from lakeshore_admin.msgpack_api import MEDIA_TYPE, MsgPackRenderer

PAUSE_ON_DATABASE_ERROR = 1.0  # seconds, as the view pauses

log = logging.getLogger("jobs.api.sdk_views")  # where the view logs


async def poll(app, environ, scope, receive, send, *, secure: bool):
    lean = app.lean
    request = await app.run(None, lean.admit_to, environ, DaemonPoll)
    if request is None:  # refused: the full stack answers, and says why (body unread)
        return await app.full_stack(scope, receive, send, refused=True)
    try:
        body = await read_all(receive)
    except Disconnected:
        await app.run(None, signals.request_finished.send, poll)
        return
    run = functools.partial(app.run, request)
    steps = None
    try:
        data = await app.run(None, parse_msgpack, environ, body)
        steps = sdk_worker.poll_steps(data, user=request.user, token=request.auth)
        first = await run(waits.first_step, steps)
    except Exception:  # noqa: BLE001 - the full stack answers it as it always has
        await app.run(None, signals.request_finished.send, poll)
        return await app.full_stack(scope, receive, send, body)
    status = 200
    try:
        payload = await waits.drive_async(steps, run, first=first, who=waits.principal(request))
    except (OperationalError, InterfaceError) as exc:
        log.warning("SDK poll: database unavailable (%s); answering no work", exc)
        await asyncio.sleep(PAUSE_ON_DATABASE_ERROR)
        payload = {"commands": []}
    except Exception:  # noqa: BLE001 - logged; the SDK shows the line
        log.exception("SDK poll failed")
        failed = sdk_error(500, "server_error", "The server failed; the error was logged.")
        status, payload = 500, failed
    finally:
        await app.run(None, signals.request_finished.send, poll)
    if status == 500:
        headers = [(k, v) for k, v in payload.items()]
        headers = [*headers, *lean.static_headers(), *lean.secure_headers(secure)]
        return await respond(send, 500, headers, payload.content)
    content = MsgPackRenderer().render(payload)
    headers = [
        ("Content-Type", MEDIA_TYPE),
        ("Content-Length", str(len(content))),
        *lean.static_headers(),
        ("Allow", allow(DaemonPoll)),
        *lean.secure_headers(secure),  # HSTS over HTTPS, as SecurityMiddleware adds it
    ]
    await respond(send, status, headers, content)
