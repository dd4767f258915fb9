"""Admission to the edge's own doors: one function decides, for every hot route the
apps declare (edge/routes.py), whether its door answers the request or Django's full
stack does, and reads the body only once the caller is known and may act.

In order: what the route notes as the request arrives, before its credential is read
(a daemon's channel: fleet/protocol.hear_on_arrival); the request line and headers
(the lean path's checks, edge/lean_path.LeanPath.headers_allow, for the body type the
door reads); the bearer token and the role the route's view asks for, on the event
loop when this process keeps the token, else in a worker thread; what the route checks
of the caller before the body (a daemon's credential on another daemon's path is
answered 403 here); then the body, read on the event loop (a GET's is never read).

A request refused for its headers goes to the full stack as it came; one refused for
its token or role goes there with its body unread, and Django refuses it before its
parsers run, saying why (tests/security/test_token_before_body_server.py)."""

import io
from dataclasses import dataclass

from edge.lean_path import ASK_IN_THREAD, LeanRequest
from edge.messages import Disconnected, read_all
from lakeshore_admin.msgpack_api import MEDIA_TYPE

# the body each door reads; the doors of a GET read none, and take any declared type
BODY_TYPES = {"lean": "application/json", "sdk-poll": MEDIA_TYPE, "await": MEDIA_TYPE}


@dataclass(frozen=True)
class Admitted:
    """A request a door answers: who sends it, the view's arguments (in the path's
    order), whether it came over HTTPS, and its body (also in environ["wsgi.input"],
    for Django should the door hand it on)."""

    request: LeanRequest
    arguments: tuple[str, ...]
    secure: bool
    body: bytes


async def admit(app, route, arguments, environ, scope, receive, send) -> Admitted | None:
    """The request, admitted to `route`'s door; or None when it has been answered or
    handed to the full stack here (refused, or its client gone)."""
    lean = app.lean
    if route.on_arrival is not None:
        route.on_arrival(environ, **arguments)
    allowed = lean.headers_allow(environ, BODY_TYPES.get(route.door) or own_media_type(environ))
    if allowed is None:
        await app.full_stack(scope, receive, send)
        return None
    secure = allowed[1]
    request = lean.kept_request(environ, route.view)  # no query: the event loop may ask
    if request is None:
        request = await app.run(None, lean.admit_to, environ, route.view)
    if request is None:
        await app.full_stack(scope, receive, send, refused=True)
        return None
    values = tuple(arguments.values())
    refused = lean.refused_before_body(request, route, values, known_only=True)
    if refused is ASK_IN_THREAD:
        refused = await app.run(None, lean.refused_before_body, request, route, values)
    if refused is not None:  # answered, the body unread
        await app.finished()
        await app.answer_outcome(send, refused, secure, route.view)
        return None
    body = b""
    if route.method != "GET":
        try:
            body = await read_all(receive)
        except Disconnected:
            await app.finished()
            return None
    environ["wsgi.input"] = io.BytesIO(body)
    return Admitted(request, values, secure, body)


def own_media_type(environ) -> str:
    """A GET's own content type, whatever it is: its body is never read."""
    return environ.get("CONTENT_TYPE", "").partition(";")[0].strip().lower()
