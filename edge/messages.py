"""What the ASGI doors (edge/application.py, sdk_poll.py, streams.py) need of ASGI itself: what
the headers say of a body, reading it, giving it again to the WSGI application,
answering."""

import asyncio
import io
import sys
from typing import Any

from django.http import HttpHeaders

from lakeshore_admin.msgpack_api import MEDIA_TYPE, MsgPackParser


def wsgi_environ(scope, stream) -> dict[str, Any]:
    """The WSGI environ (PEP 3333) of an ASGI request, its body read from `stream`: the
    request line, the server's and the client's addresses, and every header as CGI names
    it (repeated headers joined by commas)."""
    root = scope.get("root_path", "")
    path = scope["path"]
    server, port = scope.get("server") or ("localhost", 80)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": root.encode("utf-8").decode("latin-1"),
        "PATH_INFO": path[len(root) :] if path.startswith(root) else path,
        "QUERY_STRING": scope["query_string"].decode("ascii"),
        "SERVER_NAME": server,
        "SERVER_PORT": str(port or 0),
        "SERVER_PROTOCOL": f"HTTP/{scope['http_version']}",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": stream,
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    environ["PATH_INFO"] = environ["PATH_INFO"].encode("utf-8").decode("latin-1")
    if (client := scope.get("client")) is not None:
        environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = client[0], str(client[1])
    for raw_name, raw_value in scope["headers"]:
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        if name not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            name = f"HTTP_{name}"
        value = raw_value.decode("latin-1")
        environ[name] = f"{environ[name]},{value}" if name in environ else value
    return environ


class Disconnected(Exception):
    """The client went away before its body arrived."""


async def respond(send, status: int, headers, content: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(k.lower().encode("latin1"), v.encode("latin1")) for k, v in headers],
        }
    )
    await send({"type": "http.response.body", "body": content})


async def read_all(receive) -> bytes:
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


class OverBudget(Exception):
    """The bodies a process holds would pass its bound (Bodies)."""


SMALL_BODY_BYTES = 64 * 1024  # what the server buffers of any connection's body unasked


class Bodies:
    """The bytes of request bodies one process holds at once, received but not yet
    answered, bounded by `budget()`. A body of at most SMALL_BODY_BYTES is not counted
    (the server buffers that much of any connection's body anyway); a larger one counts
    its bytes as they arrive, so a length declared and never sent costs nothing. One
    body is always taken when no other is held."""

    def __init__(self, budget):
        self.budget = budget
        self.held = 0

    async def read(self, receive, length: int) -> tuple[bytes, int]:
        """The whole body and the bytes it holds of the bound (give them back with
        `release`). Disconnected: the client went; OverBudget: past the bound, the
        rest unread."""
        counted = length > SMALL_BODY_BYTES
        chunks, got = [], 0
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise Disconnected
                chunk = message.get("body", b"")
                if counted and chunk:
                    others = self.held - got
                    if others and self.held + len(chunk) > self.budget():
                        raise OverBudget
                    self.held += len(chunk)
                    got += len(chunk)
                chunks.append(chunk)
                if not message.get("more_body"):
                    return b"".join(chunks), got
        except BaseException:
            self.release(got)
            raise

    def release(self, got: int) -> None:
        self.held -= got


def gone_when_closed(receive) -> asyncio.Future:
    """A task done when the client closes its connection, once its body has been read
    (the server's next message is then http.disconnect). Cancel it once answered."""

    async def closed():
        while (await receive())["type"] != "http.disconnect":
            pass

    return asyncio.ensure_future(closed())


def body_head(scope) -> tuple[str, int | None, str | None]:
    """What a request's headers say of its body: (its media type, lower case; its
    declared length, None without a valid Content-Length; the bearer token, None
    without one)."""
    media_type, length, bearer = "", None, None
    for name, value in scope["headers"]:
        if name == b"content-type":
            media_type = value.decode("latin-1").partition(";")[0].strip().lower()
        elif name == b"content-length":
            length = int(value) if value.isdigit() else None
        elif name == b"authorization":
            parts = value.decode("latin-1").split()
            if parts and parts[0].lower() == "bearer":
                bearer = parts[1] if len(parts) == 2 else ""  # malformed: refused
    return media_type, length, bearer


class Withheld(OSError):
    """A body the server did not receive was read (Django: UnreadablePostError)."""


class _Parsing:
    """What MsgPackParser reads of a request: its declared length."""

    def __init__(self, environ):
        self.META = environ
        self.headers = HttpHeaders(environ)


def parse_msgpack(environ, body: bytes):
    """A msgpack body as the SDK views' parser reads it (its errors: the full stack's)."""
    return MsgPackParser().parse(io.BytesIO(body), MEDIA_TYPE, {"request": _Parsing(environ)})
