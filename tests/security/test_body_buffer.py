"""Issue 29, item 1: the web process receives a request's body on its event loop before
a thread serves it (lakeshore_admin/asgi.py), so the bodies it holds at once are
bounded in bytes (LAKESHORE_BODY_BUFFER_BYTES): past it a request with a body gets
503 `busy` with Retry-After at once, its body unread, and a body is taken again once
one held is let go. The control: a body that fits is served. Through the real ASGI
application in process (the bound is the application's; the transport does not
matter here)."""

import asyncio

import pytest
from django.core.handlers.wsgi import WSGIHandler

from lakeshore_admin.asgi import Application
from lakeshore_admin.fastpath import LeanPath
from tests import builders

pytestmark = pytest.mark.django_db(transaction=True)


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


async def _ask(app, length: int, body: asyncio.Future) -> tuple[int, dict, bytes]:
    """A POST declaring `length` bytes, its body given when `body` is done (None: the
    client goes): (status, headers, answer)."""
    sent = []

    async def receive():
        raw = await body
        if raw is None:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope(length), receive, send)
    if not sent:
        return 0, {}, b""
    start = sent[0]
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


async def _three(app):
    loop = asyncio.get_running_loop()
    held = loop.create_future()  # 800 bytes declared, still arriving
    waiting = asyncio.ensure_future(_ask(app, 800, held))
    await asyncio.sleep(0.1)
    over = loop.create_future()  # its body comes in 0.5 s, if it is read at all
    loop.call_later(0.5, over.set_result, b'{"name": ""}' + b" " * 488)
    refused = await _ask(app, 500, over)  # 800 + 500 > 1000: refused before its body
    fits = loop.create_future()
    fits.set_result(b'{"name": ""}' + b" " * 88)
    served = await _ask(app, 100, fits)  # 800 + 100 fits: served
    held.set_result(None)  # the first client goes: its 800 bytes are let go
    await waiting
    again = loop.create_future()
    again.set_result(b'{"name": ""}' + b" " * 488)
    after = await _ask(app, 500, again)
    return refused, served, after, app.held


def test_past_the_bodies_a_process_holds_a_request_is_refused_busy(settings):
    settings.LAKESHORE_BODY_BUFFER_BYTES = 1000
    app = Application(LeanPath(WSGIHandler()), threads=2)
    refused, served, after, held = builders.run_async(_three(app))
    status, headers, answer = refused
    assert status == 503 and headers["retry-after"] == "1"
    assert b'"code":"busy"' in answer.replace(b" ", b"")
    # the controls: a body that fits, and one after the held body is let go, are served
    # (by Django: no token, 401)
    assert served[0] == 401 and after[0] == 401
    assert held == 0
