"""The order before issue 17, for the negative controls of test_token_before_body.py:
the body read and parsed first, the token checked after.

- `ParseFirst`: the lean path with the `_take` it had (it read and parsed the JSON
  body, then `__call__` authenticated the token, keeping the parsed body until the
  answer).
- `before_django`: the body parsed as its content type says (DRF's JSON, or msgpack
  with `unpackb`'s defaults, the SDK parser's call before issue 17) before the
  server's own application runs.

`lean` and `before_django` are WSGI applications gunicorn can serve
(`gunicorn -c python:lakeshore_admin.gunicorn_conf tests.edge.parse_first:lean`)."""

import io

import msgpack
from rest_framework.utils import json as drf_json

from lakeshore_admin import wsgi  # first: it sets Django up, which the lean path needs

# isort: split
from edge.lean_path import LeanPath, read_body

KEPT = "tests.parse_first.body"  # where the parsed body stays until the answer


class ParseFirst(LeanPath):
    def _take(self, environ):
        taken = super()._take(environ)
        if taken is not None:
            environ[KEPT] = read_body(environ)  # read, parsed, put back for Django
        return taken


def parse(environ) -> object:
    """Read and parse the body as its content type says; put it back for the server."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    raw = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(raw)
    if environ.get("CONTENT_TYPE", "").startswith("application/x-msgpack"):
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    return drf_json.loads(raw.decode()) if raw.strip() else {}


def before_django(environ, start_response):
    environ[KEPT] = parse(environ)
    return wsgi.application(environ, start_response)


lean = ParseFirst(wsgi.django_application)
