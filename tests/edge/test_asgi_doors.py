"""The ASGI server's doors (edge/application.py, asgi_sdk.py) answer as the WSGI
application does: a daemon's claim and exchange as the lean path (status, headers,
body), the SDK worker's poll as the full stack, request by request, through the real
ASGI application in process. What a door may not answer (a bad token, a wrong role, a
body DRF must parse) it hands to Django, which answers as always."""

import asyncio
import json
import time

import msgpack
import pytest
from django.db import connection

from accounts.authentication import token_cache
from edge.application import Application
from edge.lean_path import LeanPath
from jobs import services
from tests.support import builders
from tests.support.doors import Counting, call, post_scope

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "lakeshore.functions.echo"
MSGPACK = "application/x-msgpack"


def asgi_call(app, path, raw: bytes, *, token, content_type="application/json", https=False):
    scope = post_scope(path, raw, token=token, content_type=content_type)
    if https:
        scope = {**scope, "scheme": "https", "server": ("localhost", 443)}
    messages = [{"type": "http.request", "body": raw, "more_body": False}]
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    builders.run_async(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    headers = {_title(k): v for k, v in headers.items() if k != "content-length"}
    return start["status"], headers, body


def wsgi_raw(app, path, raw: bytes, *, token, content_type):
    """A request through a WSGI application: (status, headers, body bytes)."""
    status, headers, body = call(
        app, path, raw=raw, token=token, content_type=content_type, decode=False
    )
    return status, _normal(headers), body


def _title(name: str) -> str:
    return "-".join(part.capitalize() for part in name.split("-"))


def _normal(headers: dict) -> dict:
    return {_title(k): v for k, v in headers.items()}


@pytest.fixture
def world():
    token_cache.clear()
    django = Counting()
    lean = LeanPath(django)
    app = Application(lean, threads=4)
    builders.queue(name="w")
    daemon_token = builders.token("daemon")
    status, _, body = call(
        django, "/api/v1/daemons/register/", {"name": "d", "queues": ["w"]}, token=daemon_token
    )
    assert status == 201
    django.calls = 0
    yield django, lean, app, body["id"], body["token"], daemon_token
    token_cache.clear()


def _json_both(world, path, body):
    django, lean, app, _, token, _ = world
    raw = json.dumps(body).encode()
    door = asgi_call(app, path, raw, token=token)
    assert django.calls == 0, "the door handed it to Django"
    status, headers, answer = call(lean, path, body, token=token)
    return (door[0], door[1], json.loads(door[2])), (status, _normal(headers), answer)


def test_a_claim_through_the_door_answers_as_the_lean_path(world):
    me = world[3]
    door, lean = _json_both(world, f"/api/v1/daemons/{me}/claim/", {"limit": 1})
    assert door == lean and door[0] == 200 and door[2] == []
    job = services.invocation_submit(function=ECHO, queue="w")[0]
    door, _ = _json_both(world, f"/api/v1/daemons/{me}/claim/", {"limit": 1, "wait": 5})
    assert door[0] == 200 and [int(row["id"]) for row in door[2]] == [job.pk]


def test_an_exchange_and_an_error_answer_as_the_lean_path(world):
    me = world[3]
    door, lean = _json_both(world, f"/api/v1/daemons/{me}/exchange/", {"limit": 0})
    assert door == lean == (200, door[1], {"recorded": [], "claimed": []})
    door, lean = _json_both(world, f"/api/v1/daemons/{me}/claim/", {"limit": "many"})
    assert door == lean and door[0] == 400


def test_a_refused_token_goes_to_django_with_its_body(world):
    django, lean, app, me, _, _ = world
    path, raw = f"/api/v1/daemons/{me}/claim/", json.dumps({"limit": 1}).encode()
    door = asgi_call(app, path, raw, token="nope")
    assert door[0] == 401 and django.calls == 1
    full = wsgi_raw(lean, path, raw, token="nope", content_type="application/json")
    assert door == full


def test_the_sdk_poll_through_the_door_answers_as_the_full_stack(world):
    django, _, app, _, _, token = world
    job = services.invocation_submit(function=ECHO, queue="w", wire="value", args_blob=b"x")[0]
    raw = msgpack.packb({"worker_id": "host-01", "timeout_s": 0, "queue": "w"})
    door = asgi_call(app, "/v1/daemon/poll", raw, token=token, content_type=MSGPACK)
    assert django.calls == 0, "the door handed it to Django"
    assert door[0] == 200
    commands = msgpack.unpackb(door[2])["commands"]
    assert [c["body"]["invocation_id"] for c in commands] == [str(job.pk)]
    job2 = services.invocation_submit(function=ECHO, queue="w", wire="value", args_blob=b"x")[0]
    full = wsgi_raw(django, "/v1/daemon/poll", raw, token=token, content_type=MSGPACK)
    assert (door[0], door[1]) == full[:2]
    assert msgpack.unpackb(full[2])["commands"][0]["body"]["invocation_id"] == str(job2.pk)


def test_a_bad_sdk_poll_goes_to_the_full_stack_with_its_body(world):
    django, _, app, _, _, token = world
    raw = msgpack.packb({"timeout_s": 0, "queue": "w"})  # no worker_id
    status, headers, body = asgi_call(
        app, "/v1/daemon/poll", raw, token=token, content_type=MSGPACK
    )
    assert django.calls == 1
    assert status == 400 and "worker_id" in body.decode()


def test_a_claims_wait_counts_from_when_the_door_took_it(world):
    """Every worker thread is busy for 6 s when a claim with wait 8 arrives: its first
    step runs 6 s late, and it still answers 8 s after it was sent (the time it spent
    queued counts in its wait), not 14 s."""
    busy_for, wait = 6, 8
    _, _, app, me, token, _ = world
    busy = [app.steps.submit(time.sleep, busy_for) for _ in range(4)]
    raw = json.dumps({"limit": 1, "wait": wait}).encode()
    started = time.monotonic()
    status, _, body = asgi_call(app, f"/api/v1/daemons/{me}/claim/", raw, token=token)
    took = time.monotonic() - started
    assert all(f.done() for f in busy)
    assert (status, json.loads(body)) == (200, [])
    assert wait - 0.2 <= took < wait + busy_for / 2  # its wait, not its wait after the queue


def test_a_kept_token_without_the_role_is_still_refused_by_django(world, settings):
    """A token this process keeps (it authenticated a moment ago) is admitted on the
    event loop only when its role may take the route: a viewer's goes to Django, which
    answers 403 and says why; the daemon's own kept credential is answered by the door."""
    settings.LAKESHORE_TOKEN_CACHE_SECONDS = 60
    django, _, app, me, token, _ = world
    viewer = builders.token("viewer")
    assert wsgi_raw(django, "/api/v1/queues/", b"", token=viewer, content_type="")[0] != 401
    path, raw = f"/api/v1/daemons/{me}/claim/", json.dumps({"limit": 1}).encode()
    django.calls = 0
    status, _, body = asgi_call(app, path, raw, token=viewer)
    assert status == 403 and django.calls == 1 and "role" in body.decode()
    for _ in range(2):  # the second admitted from what the process keeps
        assert asgi_call(app, path, raw, token=token)[0] == 200
    assert django.calls == 1


def test_an_idle_claims_wait_ends_without_a_worker_thread(world):
    """A claim whose wait runs out answers from the event loop: with the one worker
    thread busy for 10 s from just after it parked, it still answers at the end of its
    1.5 s wait. The control: a claim woken by a submit in that time has work to take (a
    query), so it answers only once the thread is free."""
    busy_for = 10
    django, lean, _, me, token, _ = world
    app = Application(lean, threads=1)
    path = f"/api/v1/daemons/{me}/claim/"
    raw = json.dumps({"limit": 1, "wait": 1.5}).encode()

    async def claim(submit: bool):
        started = time.monotonic()
        call = asyncio.ensure_future(asyncio.to_thread(asgi_call, app, path, raw, token=token))
        await asyncio.sleep(0.7)  # parked by now
        app.steps.submit(time.sleep, busy_for)
        if submit:
            await asyncio.to_thread(_submit_and_close)
        status, _, body = await call
        return status, len(json.loads(body)), time.monotonic() - started

    # the control first: it answers once the thread is free, so the claim after it finds
    # the thread free when it arrives
    status, found, took = builders.run_async(claim(submit=True))
    assert (status, found) == (200, 1) and took >= busy_for
    status, found, took = builders.run_async(claim(submit=False))
    assert (status, found) == (200, 0) and took < busy_for / 2  # not when the thread is free


def _submit_and_close():
    services.invocation_submit(function=ECHO, queue="w")
    connection.close()


def test_a_submit_a_heartbeat_and_a_completion_answer_as_the_lean_path(world):
    """Without the WSGI bridge, and the same answers: a submit (an operator's token), a
    daemon's heartbeat and completion, an error, and a body only DRF may parse."""
    django, lean, app, me, token, _ = world
    operator = builders.token("operator")
    submit = {"function": ECHO, "queue": "w", "args": [1]}
    raw = json.dumps(submit).encode()
    door = asgi_call(app, "/api/v1/jobs/", raw, token=operator)
    full = call(lean, "/api/v1/jobs/", submit, token=operator)
    assert django.calls == 0 and door[0] == full[0] == 201
    assert _normal(door[1]).keys() == _normal(full[1]).keys()
    assert json.loads(door[2]).keys() == full[2].keys() and json.loads(door[2])["queue"] == "w"
    door, full = _json_both(world, f"/api/v1/daemons/{me}/heartbeat/", {"held": []})
    assert door == full and door[0] == 200
    bad = {"invocation": "1", "attempt": 1, "state": "nope"}
    door, full = _json_both(world, f"/api/v1/daemons/{me}/complete/", bad)
    assert door == full and door[0] == 400
    status, _, _ = asgi_call(app, "/api/v1/jobs/", b"{not json", token=operator)
    assert status == 400 and django.calls == 1  # DRF's parser says why


def test_the_sdk_poll_over_https_carries_hsts_as_the_full_stack(world, settings):
    settings.SECURE_HSTS_SECONDS = 600
    django, _, app, _, _, token = world
    raw = msgpack.packb({"worker_id": "host-01", "timeout_s": 0, "queue": "w"})
    door = asgi_call(app, "/v1/daemon/poll", raw, token=token, content_type=MSGPACK, https=True)
    assert django.calls == 0 and door[0] == 200
    https = {"wsgi.url_scheme": "https", "SERVER_PORT": "443"}
    full_stack = Counting()  # its SecurityMiddleware reads the setting as it is made
    status, headers, _ = call(
        full_stack,
        "/v1/daemon/poll",
        raw=raw,
        token=token,
        content_type=MSGPACK,
        extra=https,
        decode=False,
    )
    assert status == 200
    assert door[1]["Strict-Transport-Security"] == _normal(headers)["Strict-Transport-Security"]
    assert door[1]["Strict-Transport-Security"].startswith("max-age=600")
