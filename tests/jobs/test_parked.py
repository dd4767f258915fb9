"""A daemon parked in a long-poll is alive: its server renews every parked daemon at
once, a statement a turn (fleet/parked.py), so a claim may wait longer than the
heartbeat timeout and the daemon is never taken for lost; a daemon that does not wait is
not renewed (the negative control). Under the ASGI server a daemon that goes away while
its claim waits is renewed no more, and its claim, closed where it waits, takes no work
submitted after it went."""

import asyncio
import json
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from edge.application import Application
from edge.lean_path import LeanPath
from fleet import daemons, parked
from fleet.models import Daemon, DaemonState
from jobs import services
from jobs.models import Invocation
from jobs.wakeup import listener
from tests.jobs.test_long_poll import Claimer
from tests.support import builders
from tests.support.doors import Counting, post_scope

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "lakeshore.functions.echo"
TIMEOUT = 4  # LAKESHORE_HEARTBEAT_TIMEOUT here: a renewal every second
# Seconds a health check may take to answer while three requests wait: it takes
# milliseconds when the thread is free; where the thread sleeps in a request, never.
PATIENCE = 5.0


def _age(pk) -> float:
    seen = Daemon.objects.values_list("last_heartbeat_at", flat=True).get(pk=pk)
    return (timezone.now() - seen).total_seconds()


@pytest.mark.slow
def test_daemons_waiting_past_the_heartbeat_timeout_are_renewed_together(settings):
    settings.LAKESHORE_HEARTBEAT_TIMEOUT = TIMEOUT
    builders.queue(name="idle")
    waiting = [builders.daemon(queues=["idle"]) for _ in range(12)]
    silent = builders.daemon(queues=["idle"])  # registered, never claims
    old = timezone.now() - timedelta(seconds=TIMEOUT - 1)
    Daemon.objects.update(last_heartbeat_at=old)
    connection.close()

    claims = [Claimer(daemon, wait=2 * TIMEOUT) for daemon in waiting]
    for claim in claims:
        claim.start()
    time.sleep(TIMEOUT + 1)  # past the timeout, since the heartbeat and since the claims came
    reaped = daemons.reap()
    states = dict(Daemon.objects.values_list("pk", "state"))
    # the parked daemons were renewed while they waited; the silent one was not, and is lost
    assert reaped["lost"] == 1 and states[silent.pk] == DaemonState.LOST
    assert all(states[d.pk] == DaemonState.IDLE for d in waiting)
    # all in one statement a turn: one transaction's now() for every parked daemon
    beats = set(
        Daemon.objects.filter(pk__in=[d.pk for d in waiting]).values_list(
            "last_heartbeat_at", flat=True
        )
    )
    # and each still fresh: renewed every TIMEOUT / 4, where not renewed they would be
    # 2 × TIMEOUT old by now
    assert len(beats) == 1 and max(_age(d.pk) for d in waiting) < TIMEOUT
    assert all(claim.result() == [] for claim in claims)  # they waited their whole wait
    assert parked.longest_wait() > settings.LAKESHORE_HEARTBEAT_TIMEOUT


async def _park_then(app, daemon, token, *, leave: bool) -> list:
    """A claim that waits up to 30 s through the ASGI door; meanwhile the daemon goes
    (its connection closes) when `leave`, then a job is submitted. What it was sent."""
    raw = b'{"limit": 1, "wait": 30}'
    scope = post_scope(f"/api/v1/daemons/{daemon.pk}/claim/", raw, token=token)
    closed = asyncio.Event()
    body = [{"type": "http.request", "body": raw, "more_body": False}]
    sent = []

    async def receive():
        if body:
            return body.pop()
        await closed.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    async def meanwhile():
        await asyncio.sleep(1.0)  # parked by now
        if leave:
            closed.set()
            await asyncio.sleep(0.5)
        await asyncio.to_thread(_submit)

    request = asyncio.ensure_future(app(scope, receive, send))
    await meanwhile()
    try:
        await asyncio.wait_for(asyncio.shield(request), 5.0)
    except TimeoutError:
        request.cancel()
    return sent


def _submit():
    try:
        services.invocation_submit(function=ECHO, queue="gone")
    finally:
        connection.close()


@pytest.mark.parametrize("leave", [True, False])
def test_a_daemon_that_goes_while_it_waits_takes_no_work(leave):
    builders.queue(name="gone")
    daemon = builders.daemon(queues=["gone"])
    _, token = builders.credential(daemon)
    connection.close()
    app = Application(LeanPath(Counting()), threads=4)
    sent = builders.run_async(_park_then(app, daemon, token, leave=leave))
    job = Invocation.objects.get(queue="gone")
    if leave:  # no answer, and the job waits for a daemon that is there
        assert sent == [] and job.state == "queued" and job.daemon_id is None
        assert daemon.pk not in listener.renewing(parked.PARKED)  # renewed no more
    else:  # the control: the same claim, its daemon still there, takes the job at once
        assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [200]
        assert job.state == "running" and job.daemon_id == daemon.pk


def test_a_fleet_that_parks_together_comes_back_spread_over_the_wait():
    """1,000 daemons send their first claim (wait 50) within one second: their waits end
    spread evenly over the 50 s (no 5 s of it gets more than 12 %, where, ending when
    asked, all would end in one second), none later than asked; each next claim, sent
    as the last was answered, waits the whole 50 s. A short wait (a daemon with work
    coming) ends when it was asked to."""
    wait, now = 50.0, 1_000.0
    ends = {pk: parked.wait_ends(pk, wait, now + (pk % 100) / 100) for pk in range(1, 1001)}
    assert all(now < end <= now + (pk % 100) / 100 + wait for pk, end in ends.items())
    bins = [0] * 10
    for end in ends.values():
        bins[int((end - now) // 5) % 10] += 1
    assert max(bins) <= 120 and min(bins) >= 80, bins
    for pk, end in ends.items():
        assert parked.wait_ends(pk, wait, end + 0.01) == pytest.approx(end + wait)
    assert parked.wait_ends(7, 10.0, now) == now + 10.0


def _get_scope(path: str) -> dict:
    scope = post_scope(path, b"", token="none")
    headers = [(k, v) for k, v in scope["headers"] if k == b"host"]
    return {**scope, "method": "GET", "headers": headers}


async def _request(app, scope, raw: bytes, sent: list) -> None:
    """`scope` through `app`, its body `raw`; the client stays until cancelled."""
    body = [{"type": "http.request", "body": raw, "more_body": False}]

    async def receive():
        if body:
            return body.pop()
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)


async def _one_thread_three_claims(app, claims) -> tuple[list, list, float | None]:
    """Three claims that wait 30 s: _one_thread_three."""
    raw = b'{"limit": 1, "wait": 30}'
    scopes = [post_scope(path, raw, token=token) for path, token in claims]
    return await _one_thread_three(app, scopes, raw)


async def _one_thread_three(app, scopes, raw: bytes = b"") -> tuple[list, list, float | None]:
    """Three requests that wait, then GET /healthz; what each request was sent by the
    time the health check answered (or PATIENCE s passed), and how long that took."""
    sent = [[] for _ in scopes]
    waiting = [
        asyncio.ensure_future(_request(app, scope, raw, answer))
        for scope, answer in zip(scopes, sent, strict=True)
    ]
    await asyncio.sleep(1.0)  # each has looked and found nothing by now
    health: list = []
    started = time.monotonic()
    check = asyncio.ensure_future(_request(app, _get_scope("/healthz"), b"", health))
    done, _ = await asyncio.wait([check], timeout=PATIENCE)
    took = time.monotonic() - started if done else None
    for task in [check, *waiting]:
        task.cancel()
    await asyncio.gather(check, *waiting, return_exceptions=True)
    return sent, health, took


@pytest.mark.parametrize("parks", [True, False])
def test_the_full_framework_parks_a_claim_holding_no_thread(settings, parks):
    """With the lean path off, a claim is Django's and DRF's (edge/django_door.py): its
    wait is parked on the event loop (jobs/api/long_poll.py), so three claims waiting
    on a server of one worker thread leave that thread to a health check. The negative
    control: a view that is offered no parking sleeps in the thread, and the health
    check waits behind it."""
    settings.LAKESHORE_LEAN_PATH = False
    builders.queue(name="pf")
    claims = []
    for _ in range(3):
        daemon = builders.daemon(queues=["pf"])
        claims.append((f"/api/v1/daemons/{daemon.pk}/claim/", builders.credential(daemon)[1]))
    connection.close()
    django = Counting()
    app = Application(LeanPath(django), threads=1)
    door = app.django
    if not parks:  # the door offers the views no parking

        async def offering_none(scope, body, send, parking=None):
            return await door(scope, body, send, None)

        app.django = offering_none
    try:
        sent, health, took = builders.run_async(_one_thread_three_claims(app, claims))
    finally:
        listener.release_waiters()  # a claim sleeping in the thread ends now
        door.executor.shutdown(wait=True)
    assert all(answer == [] for answer in sent)  # all three still wait
    if parks:
        assert took is not None  # answered while the three waited
        assert [m["status"] for m in health if m["type"] == "http.response.start"] == [200]
        assert django.calls == 4  # the three claims and the check all went through Django
    else:
        assert took is None and health == []  # the thread sleeps in the first claim


def test_a_parked_claim_answers_with_the_headers_django_gives_it(settings, client):
    """A claim answered after a parked wait carries what the middleware and DRF give
    an answer that did not wait: the same header names, the same JSON."""
    settings.LAKESHORE_LEAN_PATH = False
    builders.queue(name="ph")
    daemon = builders.daemon(queues=["ph"])
    token = builders.credential(daemon)[1]
    path = f"/api/v1/daemons/{daemon.pk}/claim/"
    connection.close()
    app = Application(LeanPath(Counting()), threads=2)

    async def parked_then_woken() -> list:
        raw = b'{"limit": 1, "wait": 20}'
        sent: list = []
        waiting = asyncio.ensure_future(
            _request(app, post_scope(path, raw, token=token), raw, sent)
        )
        await asyncio.sleep(1.0)
        await asyncio.to_thread(_submit_to, "ph")
        for _ in range(100):
            if any(m["type"] == "http.response.body" for m in sent):
                break
            await asyncio.sleep(0.05)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        return sent

    sent = builders.run_async(parked_then_woken())
    start = next(m for m in sent if m["type"] == "http.response.start")
    parked_headers = {k.decode() for k, _ in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert start["status"] == 200 and len(json.loads(body)) == 1

    _submit_to("ph")  # the control: a claim that finds work at once, never parked
    direct = client.post(
        path, {"limit": 1}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert direct.status_code == 200 and len(direct.json()) == 1
    assert parked_headers == {name.lower() for name in direct.headers}
    vary = dict((k.decode(), v.decode()) for k, v in start["headers"])["vary"]
    assert vary == direct.headers["Vary"]


def _submit_to(queue: str) -> None:
    try:
        services.invocation_submit(function=ECHO, queue=queue)
    finally:
        connection.close()


@pytest.mark.parametrize("parks", [True, False])
def test_the_full_framework_parks_a_log_follow_holding_no_thread(settings, parks):
    """A log's follow (GET /api/v1/jobs/ID/logs/?follow=1) served by DRF's view parks
    its wait as a claim does: three follows waiting on one worker thread leave it to a
    health check; offered no parking, the first holds the thread."""
    settings.LAKESHORE_LEAN_PATH = False
    builders.queue(name="pl")
    job = services.invocation_submit(function=ECHO, queue="pl")[0]
    token = builders.token("viewer")
    connection.close()
    django = Counting()
    app = Application(LeanPath(django), threads=1)
    door = app.django
    if not parks:

        async def offering_none(scope, body, send, parking=None):
            return await door(scope, body, send, None)

        app.django = offering_none
    scope = _get_scope(f"/api/v1/jobs/{job.pk}/logs/")
    scope = {
        **scope,
        "query_string": b"follow=true&wait=10",  # past the 1 + PATIENCE s the check may take
        "headers": [*scope["headers"], (b"authorization", f"Bearer {token}".encode())],
    }
    try:
        sent, health, took = builders.run_async(_one_thread_three(app, [scope] * 3))
    finally:
        listener.release_waiters()
        door.executor.shutdown(wait=True)
    assert all(answer == [] for answer in sent)  # all three still wait
    if parks:
        assert took is not None  # answered while the three waited
        assert [m["status"] for m in health if m["type"] == "http.response.start"] == [200]
    else:
        assert took is None and health == []
