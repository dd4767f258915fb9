"""The lean door (routes of door "lean": fleet/api/routes.py, jobs/api/routes.py): what
the lean path answers (edge/lean_path.py), served on the event loop without the WSGI
bridge. Once admitted (edge/admission.py), a claim's or an exchange's answer runs as
steps (jobs/waits.py): a turn in a worker thread for its first step, its wait on this
loop, its last step in a thread unless the wait ran out. Any other (a submit, a
heartbeat, a completion) runs in one worker-thread turn. A body DRF's parser must
answer (edge/lean_path.read_body) goes to the full stack with its body given again."""

import functools

from django.core import signals

from edge.admission import admit
from edge.lean_path import TO_DJANGO, read_body
from edge.messages import gone_when_closed
from jobs import waits


async def door(app, route, arguments, environ, scope, receive, send):
    admitted = await admit(app, route, arguments, environ, scope, receive, send)
    if admitted is None:
        return None
    request, args = admitted.request, admitted.arguments
    if route.steps is not None:
        try:
            outcome = await long_poll(app, request, route.steps, args, environ, receive)
        except waits.Gone:  # the daemon went while it waited: nobody to answer
            return None
    else:
        outcome = await app.run(None, _answer_once, app.lean, request, route.answer, args, environ)
    if outcome is TO_DJANGO:  # DRF's parser answers it
        return await app.full_stack(scope, receive, send, admitted.body)
    return await app.answer_outcome(send, outcome, admitted.secure, route.view)


async def long_poll(app, request, answer_steps, args, environ, receive):
    """A claim's or an exchange's outcome: its steps driven on this loop, closed where
    they wait if the client goes (waits.Gone)."""
    steps = _answered(app.lean, request, answer_steps, args, environ)
    gone = gone_when_closed(receive)
    try:
        return await waits.drive_async(
            steps,
            functools.partial(app.run, request),
            gone=gone,
            who=waits.principal(request),
        )
    finally:
        gone.cancel()


def _answered(lean, request, answer_steps, args, environ):
    """The request's outcome, (payload, status, extra headers), as steps: its body read,
    then the answer's steps, its errors answered as the lean path's; or TO_DJANGO. No
    request_finished: its receivers give back the calling thread's database
    connections, which each step's turn in a worker thread does (Application.run), and
    the last step of a wait that ran out runs on the event loop, which holds none."""
    try:
        data = read_body(environ)
        if data is TO_DJANGO:
            return TO_DJANGO
        payload, status, *headers = yield from answer_steps(request, *args, data)
        return payload, status, tuple(headers[0].items()) if headers else ()
    except Exception as exc:  # noqa: BLE001 - the API's error body, as the lean path's
        return lean.error(exc, request)


def _answer_once(lean, request, answer, args, environ):
    """The lean path's outcome of a request whose body is in `environ` (its errors
    answered as the API's views answer them), or TO_DJANGO; the request ends here."""
    data = read_body(environ)
    if data is TO_DJANGO:
        signals.request_finished.send(sender=door)
        return TO_DJANGO
    return lean.outcome(request, lambda: answer(request, *args, data))
