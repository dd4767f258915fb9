"""Issue 29, item 1: the web process receives a request's body on its event loop before
a thread serves it (edge/application.py), so the bodies it holds at once are
bounded in bytes received (LAKESHORE_BODY_BUFFER_BYTES; lakeshore_admin/asgi_io.Bodies):
past it a request whose body is larger than 64 KiB gets 503 `busy` with Retry-After,
the rest of its body unread, and such a body is taken again once one held is let go.
The controls: a body that fits is served, a small one is always served, and a length
declared but not sent holds nothing. Through the real ASGI application in process (the
bound is the application's; the transport does not matter here)."""

import asyncio

import pytest
from django.core.handlers.wsgi import WSGIHandler

from edge.application import Application
from edge.lean_path import LeanPath
from tests.support import builders

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.security]

KIB = 1024


def scope(length: int) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/v1/queues/",
        "raw_path": b"/api/v1/queues/",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"localhost"),
            (b"content-type", b"application/json"),
            (b"content-length", str(length).encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("localhost", 80),
    }


async def _ask(app, length: int, *pieces) -> tuple[int, dict, bytes]:
    """A POST declaring `length` bytes, its body in `pieces`, each given when its future
    is done (its result None: the client goes): (status, headers, answer)."""
    sent = []
    pieces = list(pieces)

    async def receive():
        if not pieces:
            await asyncio.sleep(3600)
        raw = await pieces.pop(0)
        if raw is None:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": raw, "more_body": bool(pieces)}

    async def send(message):
        sent.append(message)

    await app(scope(length), receive, send)
    if not sent:
        return 0, {}, b""
    start = sent[0]
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


def given(raw: bytes | None) -> asyncio.Future:
    done = asyncio.get_running_loop().create_future()
    done.set_result(raw)
    return done


def json_of(size: int) -> bytes:
    return b'{"name": ""}' + b" " * (size - 12)


async def _bound(app):
    loop = asyncio.get_running_loop()
    # 800 KiB declared: 700 KiB arrived, the rest still coming
    rest = loop.create_future()
    first = asyncio.ensure_future(_ask(app, 800 * KIB, given(b" " * 700 * KIB), rest))
    # declared 10 MiB, nothing sent: holds nothing
    never = asyncio.ensure_future(_ask(app, 10 * 1024 * KIB, loop.create_future()))
    await asyncio.sleep(0.1)
    held_while = app.bodies.held
    refused = await _ask(app, 500 * KIB, given(json_of(500 * KIB)))  # 700 + 500 > 1024
    fits = await _ask(app, 100 * KIB, given(json_of(100 * KIB)))  # 700 + 100 fits
    small = await _ask(app, 60 * KIB, given(json_of(60 * KIB)))  # small: never counted
    rest.set_result(None)  # the first client goes: its 700 KiB are let go
    await first
    after = await _ask(app, 500 * KIB, given(json_of(500 * KIB)))
    never.cancel()
    return held_while, refused, fits, small, after


def test_past_the_bodies_a_process_holds_a_large_body_is_refused_busy(settings):
    settings.LAKESHORE_BODY_BUFFER_BYTES = 1024 * KIB
    app = Application(LeanPath(WSGIHandler()), threads=2)
    held_while, refused, fits, small, after = builders.run_async(_bound(app))
    assert held_while == 700 * KIB  # the 10 MiB declared and not sent: nothing
    status, headers, answer = refused
    assert status == 503 and headers["retry-after"] == "1"
    assert b'"code":"busy"' in answer.replace(b" ", b"")
    # the controls are served (by Django: no token, 401)
    assert (fits[0], small[0], after[0]) == (401, 401, 401)
    assert app.bodies.held == 0
