"""The ASGI server's doors for the SDK's await and result stream and a log's follow
(edge/streams.py) answer as the full stack does, header for header,
through the real ASGI application in process; what they may not answer (a refused
token, a bad query, an unknown invocation) goes to Django with its body. A stream is
sent as frames come, a client that goes ends it, and a stopping server cuts it short."""

import asyncio
import io
import threading
import time

import msgpack
import pytest
from django.db import connection
from django.urls import reverse

from accounts.authentication import token_cache
from edge.application import Application
from edge.lean_path import LeanPath
from jobs import sdk, sdk_frames, services, waits, wakeup
from jobs.models import Invocation
from tests.edge.test_asgi_doors import _normal, _title
from tests.support import builders
from tests.support.doors import Counting
from tests.support.job_logs import running_job, ship

pytestmark = pytest.mark.django_db(transaction=True)

MSGPACK = "application/x-msgpack"
P = "/v1/namespaces/default/producer"


def _scope(method, path, query: str, headers: dict, scheme: str = "http"):
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": scheme,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"localhost")]
        + [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 5000),
        "server": ("localhost", 80),
    }


def _headers(token, raw: bytes, content_type) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    if content_type:
        headers["Content-Type"] = content_type
    if raw:
        headers["Content-Length"] = str(len(raw))
    return headers


async def _door(
    app, method, path, query, headers, raw, *, gone_after=None, meanwhile=(), scheme="http"
):
    """Run one request through the ASGI app: the messages it sent. `gone_after`: the
    client disconnects after so many seconds; `meanwhile`: (seconds, fn) run in a thread
    of their own while the request is served."""
    loop = asyncio.get_running_loop()
    given = [{"type": "http.request", "body": raw, "more_body": False}]
    sent = []

    async def receive():
        if given:
            return given.pop(0)
        await asyncio.sleep(3600 if gone_after is None else gone_after)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append((time.monotonic(), message))

    async def later(seconds, fn):
        await asyncio.sleep(seconds)
        await loop.run_in_executor(None, _closing_connection(fn))

    helpers = [asyncio.ensure_future(later(s, fn)) for s, fn in meanwhile]
    await app(_scope(method, path, query, headers, scheme), receive, send)
    await asyncio.gather(*helpers)
    return sent


def _closing_connection(fn):
    def run():
        try:
            fn()
        finally:
            connection.close()

    return run


def asgi_call(app, method, path, *, token, query="", raw=b"", content_type=MSGPACK, **kw):
    sent = builders.run_async(
        _door(app, method, path, query, _headers(token, raw, content_type), raw, **kw)
    )
    messages = [message for _, message in sent]
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    headers = {_title(k.decode()): v.decode() for k, v in start["headers"]}
    headers.pop("Content-Length", None)
    return start["status"], headers, body, sent


def wsgi_call(app, method, path, *, token, query="", raw=b"", content_type=MSGPACK, scheme="http"):
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "80",
        "HTTP_HOST": "localhost",
        "REMOTE_ADDR": "127.0.0.1",
        "wsgi.url_scheme": scheme,
        "wsgi.input": io.BytesIO(raw),
        "HTTP_AUTHORIZATION": f"Bearer {token}",
    }
    if content_type:
        environ["CONTENT_TYPE"] = content_type
    if raw:
        environ["CONTENT_LENGTH"] = str(len(raw))
    answer = {}

    def start_response(status, headers, exc_info=None):
        answer["status"], answer["headers"] = int(status.split()[0]), dict(headers)

    result = app(environ, start_response)
    body = b"".join(result)
    if hasattr(result, "close"):
        result.close()
    headers = _normal(answer["headers"])
    headers.pop("Content-Length", None)
    return answer["status"], headers, body


@pytest.fixture
def world():
    token_cache.clear()
    django = Counting()
    app = Application(LeanPath(django), threads=4)
    builders.queue(name="w")
    yield django, app, builders.token("operator")
    assert waits.parked.held == 0, "a door left a wait counted"
    token_cache.clear()


def _both(world, method, path, **kw):
    """(the door's answer, the full stack's), and whether the door answered itself; both
    with `token` (the operator's by default)."""
    django, app, token = world
    token = kw.pop("token", token)
    django.calls = 0
    status, headers, body, _ = asgi_call(app, method, path, token=token, **kw)
    took = django.calls == 0
    return (status, headers, body), wsgi_call(django, method, path, token=token, **kw), took


def _sdk_job() -> Invocation:
    return services.invocation_submit(function="f", queue="w", wire="value", args_blob=b"x")[0]


def _running_sdk_job() -> Invocation:
    """An SDK job in its first attempt, as a worker's poll leaves it: its frames are that
    attempt's."""
    job = _sdk_job()
    Invocation.objects.filter(pk=job.pk).update(state="running", attempts=1)
    job.refresh_from_db()
    return job


def _write(job: Invocation, seq: int, frame: bytes, final: bool = False) -> None:
    """A frame of the job's attempt, as its holder writes it; a final one, then the ack
    (an attempt's final frame ends the stream once its invocation has ended)."""
    sdk_frames.insert_frame(str(job.pk), seq, frame, final, attempt=job.attempts)
    if final:
        Invocation.objects.filter(pk=job.pk).update(state="succeeded")


def _frame(seq: int, value) -> bytes:
    return msgpack.packb([0, seq, value, None])


# ---------------------------------------------------------------------------- await


def test_an_await_through_the_door_answers_as_the_full_stack(world):
    job = _sdk_job()
    raw = msgpack.packb({"invocation_id": str(job.pk), "timeout_s": 0.3})
    started = time.monotonic()
    door, full, took = _both(world, "POST", f"{P}/await", raw=raw)
    assert took, "the door handed it to Django"
    assert door == full and door[0] == 200
    assert msgpack.unpackb(door[2])["state"] == "pending"
    assert time.monotonic() - started >= 0.6  # each waited its 0.3 s


def test_an_await_is_answered_when_its_invocation_ends_meanwhile(world):
    _, app, token = world
    job = _sdk_job()
    raw = msgpack.packb({"invocation_id": str(job.pk), "timeout_s": 20})

    def kill():
        services.invocation_kill(invocation_id=job.pk)

    started = time.monotonic()
    status, _, body, _ = asgi_call(
        app, "POST", f"{P}/await", token=token, raw=raw, meanwhile=[(0.5, kill)]
    )
    assert status == 200 and msgpack.unpackb(body)["state"] == "killed"
    assert time.monotonic() - started < 10  # at its end, not its 20 s wait's


def test_an_await_that_cannot_be_answered_goes_to_the_full_stack(world):
    for body in (
        {"invocation_id": "999999", "timeout_s": 1},
        {"invocation_id": "1", "timeout_s": "x"},
    ):
        raw = msgpack.packb(body)
        door, full, took = _both(world, "POST", f"{P}/await", raw=raw)
        assert not took and door == full and door[0] in (400, 404)
        assert "Lakeshore-Error-Code" in door[1]
    door, full, took = _both(world, "POST", "/v1/namespaces/other/producer/await", raw=raw)
    assert not took and door == full and door[0] == 404


def test_a_refused_token_goes_to_the_full_stack_with_its_body(world):
    job = _sdk_job()
    raw = msgpack.packb({"invocation_id": str(job.pk), "timeout_s": 0})
    door, full, took = _both(world, "POST", f"{P}/await", raw=raw, token="nope")
    assert not took and door == full and door[0] == 401
    viewer = builders.token("viewer")
    door, full, took = _both(world, "POST", f"{P}/await", raw=raw, token=viewer)
    assert not took and door == full and door[0] == 403


def test_an_invocation_gone_while_awaited_answers_as_an_unknown_one(world):
    _, app, token = world
    job = _sdk_job()
    raw = msgpack.packb({"invocation_id": str(job.pk), "timeout_s": 5})
    door = asgi_call(
        app,
        "POST",
        f"{P}/await",
        token=token,
        raw=raw,
        meanwhile=[(0.3, lambda: Invocation.objects.filter(pk=job.pk).delete())],
    )
    full = wsgi_call(world[0], "POST", f"{P}/await", token=token, raw=raw)
    assert door[:3] == full and full[0] == 404


# ---------------------------------------------------------------------------- result stream


def test_a_stored_stream_through_the_door_answers_as_the_full_stack(world):
    job = _running_sdk_job()
    for seq in range(3):
        _write(job, seq, _frame(seq, seq * seq), final=seq == 2)
    path = f"{P}/invocations/{job.pk}/result/stream"
    for query in ("since=-1", "since=0", ""):
        door, full, took = _both(world, "GET", path, query=query)
        assert took and door == full and door[0] == 200
    assert door[1]["Content-Type"] == "application/x-msgpack-stream"
    assert [f[1] for f in msgpack.Unpacker(io.BytesIO(door[2]))] == [0, 1, 2]
    # a GET without a content type (curl) is taken too
    door, full, took = _both(world, "GET", path, query="since=1", content_type="")
    assert took and door == full and len(door[2]) == len(_frame(2, 4))


def test_a_live_stream_sends_each_frame_as_it_comes_and_ends_at_the_final_one(world, monkeypatch):
    """Each frame, and the invocation's end, wakes the stream (notified): with its own
    looks pushed a minute apart, it still sends both frames and ends within seconds."""
    monkeypatch.setattr(sdk, "LOOK_SDK", 60.0)
    _, app, token = world
    job = _running_sdk_job()
    stream = str(job.pk)
    meanwhile = [
        (0.4, lambda: _write(job, 0, _frame(0, "a"))),
        (0.8, lambda: _write(job, 1, _frame(1, "b"), final=True)),
    ]
    started = time.monotonic()
    status, _, body, sent = asgi_call(
        app, "GET", f"{P}/invocations/{stream}/result/stream", token=token, meanwhile=meanwhile
    )
    assert time.monotonic() - started < 30  # woken each time: its next look was 60 s away
    assert status == 200
    chunks = [m for _, m in sent if m["type"] == "http.response.body"]
    assert [c["body"] for c in chunks] == [_frame(0, "a"), _frame(1, "b"), b""]
    assert [c["more_body"] for c in chunks] == [True, True, False]
    assert world[0].calls == 0


def test_a_client_that_goes_ends_its_stream(world, settings):
    _, app, token = world
    job = _sdk_job()
    started = time.monotonic()
    *_, sent = asgi_call(
        app, "GET", f"{P}/invocations/{job.pk}/result/stream", token=token, gone_after=0.5
    )
    assert time.monotonic() - started < 30  # not its 60 s of silence
    assert not any(m.get("more_body") is False for _, m in sent), "a gone client got an end"


def test_a_quiet_stream_ends_after_its_silence_and_a_bad_since_goes_to_the_full_stack(
    world, settings
):
    settings.LAKESHORE_SDK_STREAM_IDLE_SECONDS = 1
    door, full, took = _both(world, "GET", f"{P}/invocations/topic-a/result/stream")
    assert took and door == full == (200, door[1], b"")
    door, full, took = _both(world, "GET", f"{P}/invocations/1/result/stream", query="since=x")
    assert not took and door == full and door[0] == 400


def test_a_stopping_server_cuts_a_stream_short(world, monkeypatch):
    _, app, token = world
    job = _running_sdk_job()
    _write(job, 0, _frame(0, "a"))
    monkeypatch.setattr(type(wakeup.listener), "closing", property(lambda self: True))
    status, _, body, sent = asgi_call(
        app, "GET", f"{P}/invocations/{job.pk}/result/stream", token=token
    )
    assert status == 200 and body == _frame(0, "a")
    assert not any(m.get("more_body") is False for _, m in sent), "a cut stream got an end"


def test_no_room_to_park_sends_a_stream_to_the_full_stack(world, settings):
    settings.LAKESHORE_MAX_PARKED = 0
    settings.LAKESHORE_MAX_WAITS = 0
    job = _sdk_job()
    door, full, took = _both(world, "GET", f"{P}/invocations/{job.pk}/result/stream")
    assert not took and door == full and door[0] == 503 and door[1]["Retry-After"] == "1"


# ---------------------------------------------------------------------------- log follow


def _logs_path(job: int) -> str:
    return reverse("job-logs", args=[job])


def test_a_follow_through_the_door_answers_as_the_full_stack(world):
    job, me, daemon = running_job()
    ship(daemon, me, job, [["o", 1.0, "hello"], ["e", 2.0, "oops"]])
    path = _logs_path(job)
    for query in ("follow=1&wait=0.3", "follow=1&offset=2&wait=0.3", "follow=0&tail=1"):
        door, full, took = _both(world, "GET", path, query=query, content_type="")
        assert took, query
        assert door == full and door[0] == 200, query
    viewer = builders.token("viewer")
    door, full, took = _both(
        world, "GET", path, query="follow=1&wait=0", content_type="", token=viewer
    )
    assert took and door == full and door[0] == 200


def test_a_follow_wakes_for_a_line_shipped_meanwhile(world):
    _, app, token = world
    job, me, daemon = running_job()
    meanwhile = [(0.5, lambda: ship(daemon, me, job, [["o", 1.0, "late"]]))]
    started = time.monotonic()
    status, _, body, _ = asgi_call(
        app,
        "GET",
        _logs_path(job),
        token=token,
        query="follow=1&wait=20",
        content_type="",
        meanwhile=meanwhile,
    )
    assert status == 200 and b'"late"' in body
    assert time.monotonic() - started < 10  # at the line, not its 20 s wait's end


def test_a_follow_the_door_may_not_answer_goes_to_the_full_stack(world):
    job, _, _ = running_job()
    path = _logs_path(job)
    for query, accept in (
        ("follow=1&wait=99", None),  # past the longest wait: 400
        ("follow=1&wait=0&format=json", None),
        ("follow=1&wait=0", "text/html"),  # 406
        ("follow=1&wait=0", "application/json; indent=4"),
    ):
        django, app, token = world
        django.calls = 0
        headers = {"Authorization": f"Bearer {token}"}
        if accept:
            headers["Accept"] = accept
        builders.run_async(_door(app, "GET", path, query, headers, b""))
        assert django.calls == 1, query
    daemon = builders.token("daemon")
    door, full, took = _both(world, "GET", path, query="follow=1", content_type="", token=daemon)
    assert not took and door == full and door[0] == 403
    door, full, took = _both(world, "GET", _logs_path(999999), query="follow=1", content_type="")
    assert not took and door == full and door[0] == 404


def test_many_parked_waits_hold_no_thread(world):
    """Forty awaits and forty streams at once, through a door with 4 worker threads."""
    _, app, token = world
    jobs = [_sdk_job() for _ in range(40)]
    before = threading.active_count()

    async def all_at_once():
        awaits = [
            _door(
                app,
                "POST",
                f"{P}/await",
                "",
                _headers(
                    token,
                    raw := msgpack.packb({"invocation_id": str(j.pk), "timeout_s": 2}),
                    MSGPACK,
                ),
                raw,
            )
            for j in jobs
        ]
        streams = [
            _door(
                app,
                "GET",
                f"{P}/invocations/{j.pk}/result/stream",
                "",
                _headers(token, b"", MSGPACK),
                b"",
                gone_after=2,
            )
            for j in jobs
        ]
        seen = {}

        async def count():
            """The most parked and the most threads seen while they run: a loaded machine
            lets the requests through their 4 threads later, so one fixed look may come
            before most have parked."""
            seen["parked"] = seen["threads"] = 0
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline and seen["parked"] < 40:
                seen["parked"] = max(seen["parked"], waits.parked.held)
                seen["threads"] = max(seen["threads"], threading.active_count())
                await asyncio.sleep(0.02)

        answers = await asyncio.gather(count(), *awaits, *streams)
        return seen, answers[1:]

    started = time.monotonic()
    seen, answers = builders.run_async(all_at_once())
    assert time.monotonic() - started < 20  # in turns through 4 threads: 80 × 2 s / 4
    assert seen["parked"] >= 40  # the streams, and the awaits asleep at one moment
    assert seen["threads"] <= before + 4 + 2
    statuses = [
        next(m for _, m in sent if m["type"] == "http.response.start")["status"] for sent in answers
    ]
    assert statuses == [200] * 80


@pytest.fixture
def hsts(settings):
    """Before `world`: Django's SecurityMiddleware reads it when the stack is built."""
    settings.SECURE_HSTS_SECONDS = 3600


def test_over_https_the_doors_add_hsts_as_the_full_stack_does(hsts, world):
    job = _running_sdk_job()
    _write(job, 0, _frame(0, "a"), final=True)
    raw = msgpack.packb({"invocation_id": str(job.pk), "timeout_s": 0})
    for method, path, kw in (
        ("POST", f"{P}/await", {"raw": raw}),
        ("GET", f"{P}/invocations/{job.pk}/result/stream", {}),
        ("GET", _logs_path(job.pk), {"query": "follow=1&wait=0", "content_type": ""}),
    ):
        door, full, took = _both(world, method, path, scheme="https", **kw)
        assert took and door == full and door[0] == 200, path
        assert door[1]["Strict-Transport-Security"] == "max-age=3600", path
