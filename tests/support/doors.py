"""Requests through the server's doors in this process, as a client would send them: a
POST to a WSGI application (`call`: Django's, or the lean path in front of it), the
ASGI scope of a POST (`post_scope`), and Django's application counting the requests it
was handed (`Counting`: what a door passed on)."""

import io
import json

from django.core.handlers.wsgi import WSGIHandler


class Counting:
    """Django's application, counting the requests it was handed."""

    def __init__(self):
        self.app = WSGIHandler()  # built after the test's settings: middleware reads them
        self.calls = 0

    def __call__(self, environ, start_response):
        self.calls += 1
        return self.app(environ, start_response)


def call(
    app,
    path,
    body=None,
    *,
    token,
    content_type="application/json",
    extra=None,
    raw=None,
    decode=True,
):
    if raw is None:
        raw = b"" if body is None else json.dumps(body).encode()
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "80",
        "HTTP_HOST": "localhost",
        "REMOTE_ADDR": "127.0.0.1",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(raw),
        "CONTENT_LENGTH": str(len(raw)),
        "CONTENT_TYPE": content_type,
        "HTTP_AUTHORIZATION": f"Bearer {token}",
        **(extra or {}),
    }
    answer = {}

    def start_response(status, headers, exc_info=None):
        answer["status"] = int(status.split()[0])
        answer["headers"] = dict(headers)

    result = app(environ, start_response)
    body = b"".join(result)
    if hasattr(result, "close"):
        result.close()
    answer["headers"].pop("Content-Length", None)
    if not decode:  # the body's bytes (msgpack, an SDK error's text)
        return answer["status"], answer["headers"], body
    return answer["status"], answer["headers"], json.loads(body) if body else None


def post_scope(path, raw: bytes, *, token, content_type="application/json") -> dict:
    """An ASGI scope of a POST of `raw` to `path` with a bearer token."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"localhost"),
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(raw)).encode()),
            (b"authorization", f"Bearer {token}".encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("localhost", 80),
    }
