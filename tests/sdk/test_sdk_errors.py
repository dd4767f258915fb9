"""What the real SDK (dreamlake-lakeshore 0.5.0) shows when this server refuses a call.

The SDK does not decode an error answer: it raises DispatchError("<path> -> <status>:
<the body as text, 200 characters>"). So every /v1/ error answers one line of text,
`message (code)` (lakeshore_admin/api_errors.sdk_error). These tests make the SDK's own
calls and read str() of what it raises, as its user would; the control shows what the
SDK printed for the msgpack error body this server used to answer."""

import http.server
import sys
import threading

import httpx
import msgpack
import pytest

from lakeshore_admin.api_errors import error_body
from queues import services as queue_services
from tests.support import builders

dls = pytest.importorskip("dreamlake.lakeshore")
from dreamlake.lakeshore.dispatch import DispatchError  # noqa: E402

from tests.support import sdk_udfs  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def readable(text: str) -> bool:
    """One line a person can read: printable characters only, no byte escapes and no
    U+FFFD (what a byte that is not UTF-8 becomes)."""
    return text.isprintable() and "\\x" not in text and "\ufffd" not in text


def refusal(call) -> str:
    with pytest.raises(DispatchError) as raised:
        call()
    return str(raised.value)


@pytest.fixture
def sdk(live_server):
    """An HttpDispatch of the SDK for a token role (None: no token), closed at the end."""
    made = []

    def make(role: str | None = "operator", token: str | None = None):
        token = token or (builders.token(role) if role else None)
        dispatch = dls.HttpDispatch(live_server.url, token=token, timeout=30)
        made.append(dispatch)
        return dispatch

    yield make
    for dispatch in made:
        dispatch.close()


def test_every_refused_submit_reads_as_a_sentence_with_its_code(sdk, settings):
    builders.queue(name="gpu", max_depth=1)
    builders.queue(name="winding-down")
    queue_services.queue_transition(name="winding-down", action="drain")
    operator = sdk("operator")
    sdk_udfs.add.submit(1, 2, _dispatch=operator)  # gpu is now full

    def submit(dispatch, queue="gpu"):
        return lambda: dls.SyncQueue(queue, dispatch=dispatch).submit(b"x")

    shown = {
        "no token": refusal(submit(sdk(None))),
        "viewer": refusal(submit(sdk("viewer"))),
        "missing queue": refusal(submit(operator, "nowhere")),
        "draining": refusal(submit(operator, "winding-down")),
        "full": refusal(lambda: sdk_udfs.add.submit(3, 4, _dispatch=operator)),
        "bad input": refusal(
            lambda: dls.SyncQueue("gpu", dispatch=operator).submit(b"x", priority=1e9)
        ),
    }
    settings.LAKESHORE_SDK_MAX_BLOB_BYTES = 1000
    big = dls.SyncQueue("gpu", dispatch=operator)
    shown["too large"] = refusal(lambda: big.submit(b"y" * 5000))

    path = "/v1/namespaces/default/producer/submit"
    expected = {
        "bad input": (400, "run_config.priority must be between", "invalid"),
        "no token": (401, "Authentication credentials were not provided.", "not_authenticated"),
        "viewer": (403, "operator role", "permission_denied"),
        "missing queue": (404, "nowhere", "not_found"),
        "draining": (409, "'lakeshore queues resume winding-down'", "queue_not_admitting"),
        "full": (429, "gpu", "backlog_full"),
        "too large": (413, "LAKESHORE_SDK_MAX_BLOB_BYTES", "too_large"),
    }
    for case, (status, says, code) in expected.items():
        text = shown[case]
        assert text.startswith(f"{path} -> {status}: "), (case, text)
        assert says in text and text.endswith(f" ({code})"), (case, text)
        assert readable(text), (case, text)


def test_the_workers_poll_with_a_bad_token_reads_as_a_sentence(sdk):
    builders.queue(name="gpu")
    worker = sdk(token="not-a-token-of-this-server")

    text = refusal(lambda: worker.claim("gpu", "host-01"))

    assert text.startswith("/v1/daemon/poll -> 401: ") and text.endswith(
        " (authentication_failed)"
    ), text
    assert readable(text), text


def test_an_unknown_sdk_address_and_namespace_read_as_sentences(sdk, live_server):
    other = dls.HttpDispatch(live_server.url, token=builders.token("operator"), namespace="x")
    try:
        text = refusal(lambda: dls.SyncQueue("gpu", dispatch=other).submit(b"x"))
    finally:
        other.close()
    assert "Namespace 'x' does not exist" in text and text.endswith(" (namespace_unknown)")
    assert readable(text), text


def test_the_stock_worker_stops_with_a_readable_line(sdk, live_server, processes, tmp_path):
    """The SDK's own daemon ends at a refused poll: the last line it prints says why."""
    builders.queue(name="gpu")
    command = [sys.executable, "-m", "dreamlake.lakeshore.daemon", "--url", live_server.url]
    command += ["--token", "wrong", "--queue", "gpu", "--once"]
    proc = processes(command, name="worker", env={"LAKESHORE_HOME": str(tmp_path)})
    assert proc.wait(60) != 0
    output = next(tmp_path.glob("worker-*.log")).read_text()
    last = output.strip().splitlines()[-1]
    assert last.startswith("dreamlake.lakeshore.dispatch.DispatchError: /v1/daemon/poll -> 401")
    assert readable(last), last


# --- the control: the answer this server gave before -------------------------------------------


class OldShape(http.server.BaseHTTPRequestHandler):
    """Answers every POST as this server's /v1/ errors used to: the API's error body,
    packed as msgpack."""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = msgpack.packb(
            error_body("not_authenticated", "Authentication credentials were not provided."),
            use_bin_type=True,
        )
        self.send_response(401)
        self.send_header("content-type", "application/x-msgpack")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_control_the_old_msgpack_error_body_is_unreadable_in_the_sdk():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OldShape)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dispatch = dls.HttpDispatch(f"http://127.0.0.1:{server.server_port}", timeout=10)
    try:
        text = refusal(lambda: dls.SyncQueue("gpu", dispatch=dispatch).submit(b"x"))
    finally:
        dispatch.close()
        server.shutdown()
    assert "Authentication credentials were not provided." in text
    assert not readable(text), text


def test_errors_outside_the_sdk_views_answer_the_same_line(live_server, settings):
    """An unknown /v1/ address, and a header Django's middleware refuses (431)."""
    unknown = httpx.post(f"{live_server.url}/v1/nothing/here", content=b"")
    assert (unknown.status_code, unknown.text) == (
        404,
        "No SDK endpoint at /v1/nothing/here. (not_found)",
    )
    assert unknown.headers["Lakeshore-Error-Code"] == "not_found"
    settings.LAKESHORE_MAX_HEADER_BYTES = 100
    huge = httpx.post(f"{live_server.url}/v1/daemon/poll", headers={"X-Big": "x" * 200})
    assert huge.status_code == 431 and huge.text.endswith(" (too_large)"), huge.text
    assert readable(huge.text) and huge.headers["content-type"].startswith("text/plain")
