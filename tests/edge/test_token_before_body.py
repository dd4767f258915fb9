"""Issue 17, "Check the token before the body": a request with a bad token gets 401
(or 429 past the bad-token limit) before a byte of its body is read, through both
doors (the lean path, and Django with DRF) and on the SDK's msgpack routes.

Here, through the real WSGI application in this process, the body is a stream that
counts the bytes read from it. tests/edge/test_token_before_body_server.py
measures the memory of a real gunicorn."""

import io

import pytest
from django.core.handlers.wsgi import WSGIHandler
from rest_framework.utils import json as drf_json

from accounts.authentication import BearerTokenAuthentication, token_cache
from edge.lean_path import LeanPath
from tests.edge.parse_first import ParseFirst
from tests.support import builders
from tests.support.sdk_wire import decoded as sdk_decoded

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.security]

MIB = 1024 * 1024
CLAIM = "/api/v1/daemons/{}/claim/"
POLL = "/v1/daemon/poll"


def json_bomb(size: int = 10 * MIB) -> bytes:
    """`[{},{},…]`: about 25 bytes of memory per byte once parsed."""
    count = (size - 2) // 3
    return b"[" + b"{}," * (count - 1) + b"{}]"


def msgpack_bomb(size: int = 10 * MIB) -> bytes:
    """An array of empty maps: one dict per byte once unpacked."""
    count = size - 5
    return b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count


class Counted(io.RawIOBase):
    """A request body that counts what is read of it."""

    def __init__(self, raw: bytes):
        self._raw = io.BytesIO(raw)
        self.read_bytes = 0

    def readable(self):
        return True

    def read(self, size=-1):
        data = self._raw.read(size)
        self.read_bytes += len(data)
        return data

    def readline(self, size=-1):
        data = self._raw.readline(size)
        self.read_bytes += len(data)
        return data


def call(app, path, raw: bytes, *, token: str, content_type="application/json"):
    """(status, headers, body, bytes of the body read)."""
    body = Counted(raw)
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "80",
        "HTTP_HOST": "localhost",
        "REMOTE_ADDR": "127.0.0.1",
        "wsgi.url_scheme": "http",
        "wsgi.input": body,
        "CONTENT_LENGTH": str(len(raw)),
        "CONTENT_TYPE": content_type,
        "HTTP_AUTHORIZATION": f"Bearer {token}",
    }
    answer = {}

    def start_response(status, headers, exc_info=None):
        answer["status"] = int(status.split()[0])
        answer["headers"] = dict(headers)

    result = app(environ, start_response)
    content = b"".join(result)
    if hasattr(result, "close"):
        result.close()
    if path.startswith("/v1/"):
        decoded = sdk_decoded(answer["status"], answer["headers"], content)
    else:
        decoded = drf_json.loads(content)
    return answer["status"], answer["headers"], decoded, body.read_bytes


@pytest.fixture
def daemon_id():
    token_cache.clear()
    builders.queue(name="w")
    return builders.daemon(queues=["w"]).pk


def assert_refused(answer, status=401, code="authentication_failed"):
    got_status, headers, body, _ = answer
    assert got_status == status, body
    assert body["error"]["code"] == code
    if status == 401:
        assert headers["WWW-Authenticate"] == 'Bearer realm="lakeshore"'


# ---------------------------------------------------------------------------- the lean path


def test_a_bad_token_with_10_mib_of_json_gets_401_on_the_lean_path_unread(daemon_id):
    answer = call(LeanPath(WSGIHandler()), CLAIM.format(daemon_id), json_bomb(), token="x")
    assert_refused(answer)
    assert answer[3] == 0, "the body was read before the token was checked"


def test_past_the_bad_token_limit_429_comes_before_the_body_too(daemon_id, settings):
    settings.LAKESHORE_BAD_TOKEN_LIMIT = 2
    app = LeanPath(WSGIHandler())
    answers = [call(app, CLAIM.format(daemon_id), json_bomb(MIB), token="x") for _ in range(3)]
    assert [a[0] for a in answers] == [401, 401, 429]
    assert_refused(answers[2], 429, "throttled")
    assert [a[3] for a in answers] == [0, 0, 0]


def test_a_role_the_route_refuses_gets_403_with_the_body_unread(daemon_id):
    viewer = builders.token("viewer")
    answer = call(LeanPath(WSGIHandler()), CLAIM.format(daemon_id), json_bomb(), token=viewer)
    assert_refused(answer, 403, "permission_denied")
    assert answer[3] == 0


def test_a_good_token_still_has_its_body_read_and_answered(daemon_id):
    raw = b'{"queue": "w"}'
    status, _, body, read = call(
        LeanPath(WSGIHandler()), "/api/v1/jobs/", raw, token=builders.token()
    )
    assert status == 400 and body["error"]["fields"]["function"]
    assert read == len(raw)


def test_control_the_order_before_issue_17_reads_and_parses_the_body(daemon_id):
    """The lean path's previous `_take` (parse, then authenticate): the same 401, but
    only after the whole body was read and parsed."""
    bomb = json_bomb()
    answer = call(ParseFirst(WSGIHandler()), CLAIM.format(daemon_id), bomb, token="x")
    assert_refused(answer)
    assert answer[3] == len(bomb)


# ---------------------------------------------------------------------------- the full path


def test_a_bad_token_with_10_mib_of_json_gets_401_on_the_full_path_unread(daemon_id, settings):
    settings.LAKESHORE_LEAN_PATH = False
    answer = call(LeanPath(WSGIHandler()), CLAIM.format(daemon_id), json_bomb(), token="x")
    assert_refused(answer)
    assert answer[3] == 0


def test_a_bad_token_with_10_mib_of_msgpack_gets_401_on_the_sdk_poll_unread(daemon_id):
    answer = call(
        LeanPath(WSGIHandler()),
        POLL,
        msgpack_bomb(),
        token="x",
        content_type="application/x-msgpack",
    )
    assert_refused(answer)
    assert answer[3] == 0


@pytest.mark.parametrize("path", ["claim", "poll"])
def test_control_authenticating_after_the_body_reads_it_on_the_full_path(
    daemon_id, settings, monkeypatch, path
):
    """DRF with its authentication made to touch request.data first (the order this
    guards against): the same 401, after the whole body was read."""
    settings.LAKESHORE_LEAN_PATH = False
    authenticate = BearerTokenAuthentication.authenticate

    def data_first(self, request):
        request.data  # noqa: B018 - the parsers run here
        return authenticate(self, request)

    monkeypatch.setattr(BearerTokenAuthentication, "authenticate", data_first)
    if path == "claim":
        bomb, route, kind = json_bomb(MIB), CLAIM.format(daemon_id), "application/json"
    else:
        bomb, route, kind = msgpack_bomb(MIB), POLL, "application/x-msgpack"
    answer = call(LeanPath(WSGIHandler()), route, bomb, token="x", content_type=kind)
    assert answer[0] in (400, 401)  # DRF answers a parse error or the token, as it meets them
    assert answer[3] == len(bomb)
