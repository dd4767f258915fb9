"""The SDK worker's poll through the ASGI server (edge/application.py): POST
/v1/daemon/poll (fleet/api/routes.py, door "sdk-poll"), a long-poll of up to a second
that every idle SDK worker repeats, is served as steps (fleet/sdk_worker.poll_steps):
each step in a worker thread, the wait parked on the event loop, holding no thread.

It takes a poll once admitted (edge/admission.py: a msgpack body, a bearer token with
the view's role, before a byte of the body is read). Then it parses the body and runs
the first step; if any of that fails, the whole request goes to the full
stack with its body given again, which answers as it always has (the SDK's one line of
text). Once parked, a database that goes away answers no work after a pause, as the
view does (fleet/api/sdk_worker.py): any error would end the SDK's worker."""

import asyncio
import functools
import logging

from django.db import InterfaceError, OperationalError

from edge.admission import admit
from edge.messages import parse_msgpack
from fleet import sdk_worker
from jobs import waits
from lakeshore_admin.api_errors import sdk_error
from lakeshore_admin.msgpack_api import MEDIA_TYPE, MsgPackRenderer

PAUSE_ON_DATABASE_ERROR = 1.0  # seconds, as the view pauses

log = logging.getLogger("jobs.api.sdk_views")  # where the view logs


async def poll(app, route, arguments, environ, scope, receive, send):
    admitted = await admit(app, route, arguments, environ, scope, receive, send)
    if admitted is None:
        return None
    request = admitted.request
    run = functools.partial(app.run, request)
    steps = None
    try:
        data = await app.run(None, parse_msgpack, environ, admitted.body)
        steps = sdk_worker.poll_steps(data, user=request.user, token=request.auth)
        first = await run(waits.first_step, steps)
    except Exception:  # noqa: BLE001 - the full stack answers it as it always has
        await app.finished()
        return await app.full_stack(scope, receive, send, admitted.body)
    try:
        payload = await waits.drive_async(steps, run, first=first, who=waits.principal(request))
    except (OperationalError, InterfaceError) as exc:
        log.warning("SDK poll: database unavailable (%s); answering no work", exc)
        await asyncio.sleep(PAUSE_ON_DATABASE_ERROR)
        payload = {"commands": []}
    except Exception:  # noqa: BLE001 - logged; the SDK shows the line
        log.exception("SDK poll failed")
        failed = sdk_error(500, "server_error", "The server failed; the error was logged.")
        await app.finished()
        return await app.answer_response(send, failed, secure=admitted.secure, view=route.view)
    await app.finished()
    content = MsgPackRenderer().render(payload)
    await app.answer(
        send, 200, content, content_type=MEDIA_TYPE, secure=admitted.secure, view=route.view
    )
