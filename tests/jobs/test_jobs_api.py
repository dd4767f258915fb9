import threading
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from jobs import services
from jobs.models import Invocation
from queues import services as queue_services
from tests.support import builders

pytestmark = pytest.mark.django_db

ECHO = "lakeshore.functions.echo"


def _error(response, status, code=None):
    assert response.status_code == status, response.content
    body = response.json()["error"]
    if code:
        assert body["code"] == code
    return body


# ---------------------------------------------------------------------------- submit


def test_it_submits_into_a_named_queue(operator):
    builders.queue(name="training-h100")
    response = operator.post(
        "/api/v1/jobs/",
        {"function": ECHO, "queue": "training-h100", "args": [1], "kwargs": {"x": 2}},
        format="json",
    )
    assert response.status_code == 201
    body = response.json()
    assert body["state"] == "queued" and body["queue"] == "training-h100"
    assert body["worker"] is None and isinstance(body["id"], str)
    assert set(body) >= {
        "id", "queue", "function", "args", "kwargs", "priority", "state", "worker",
        "attempts", "max_attempts", "timeout_s", "key", "reason", "result", "error",
        "created_at", "started_at", "finished_at",
    }  # fmt: skip


def test_it_submits_into_the_default_queue(operator):
    response = operator.post("/api/v1/jobs/", {"function": ECHO}, format="json")
    assert response.status_code == 201 and response.json()["queue"] == ""


def test_an_idempotency_key_returns_the_first_invocation(operator):
    first = operator.post("/api/v1/jobs/", {"function": ECHO, "key": "nightly"}, format="json")
    again = operator.post("/api/v1/jobs/", {"function": ECHO, "key": "nightly"}, format="json")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert Invocation.objects.count() == 1


def test_it_refuses_unknown_draining_and_archived_queues(operator):
    _error(operator.post("/api/v1/jobs/", {"function": ECHO, "queue": "nope"}, format="json"), 404)
    builders.queue(name="d")
    queue_services.queue_transition(name="d", action="drain")
    body = _error(
        operator.post("/api/v1/jobs/", {"function": ECHO, "queue": "d"}, format="json"), 409
    )
    assert "draining" in body["message"]
    queue_services.queue_transition(name="d", action="archive")
    _error(operator.post("/api/v1/jobs/", {"function": ECHO, "queue": "d"}, format="json"), 409)


def test_a_paused_queue_admits(operator):
    builders.queue(name="p")
    queue_services.queue_transition(name="p", action="pause")
    response = operator.post("/api/v1/jobs/", {"function": ECHO, "queue": "p"}, format="json")
    assert response.status_code == 201


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"function": "not a path"}, "function"),
        ({"function": ECHO, "args": {"a": 1}}, "args"),
        ({"function": ECHO, "kwargs": [1]}, "kwargs"),
        ({"function": ECHO, "priority": "high"}, "priority"),
        ({"function": ECHO, "timeout_s": 0}, "timeout_s"),
        ({"function": ECHO, "max_attempts": 0}, "max_attempts"),
        ({"function": ECHO, "queue": "Bad_Name"}, "queue"),
        ({"function": ECHO, "prio": 1}, "prio"),
        ({}, "function"),
    ],
)
def test_it_refuses_bad_input(operator, payload, field):
    body = _error(operator.post("/api/v1/jobs/", payload, format="json"), 400, "invalid")
    assert field in body["fields"]


def test_a_full_queue_rejects_with_the_depth(operator):
    builders.queue(name="small", max_depth=2, on_full="reject")
    for _ in range(2):
        operator.post("/api/v1/jobs/", {"function": ECHO, "queue": "small"}, format="json")
    response = operator.post("/api/v1/jobs/", {"function": ECHO, "queue": "small"}, format="json")
    body = _error(response, 429, "backlog_full")
    assert body["depth"] == 2 and "full" in body["message"]


@pytest.mark.django_db(transaction=True)
def test_a_full_blocking_queue_waits_for_room(settings):
    settings.LAKESHORE_BLOCK_TIMEOUT = 60  # only room can end this wait within the test
    builders.queue(name="b", max_depth=1, on_full="block")
    first, _ = services.invocation_submit(function=ECHO, queue="b")
    log: list[str] = []
    lock = threading.Lock()
    started, returned = threading.Event(), threading.Event()
    outcome: dict = {}

    def submit():
        started.set()
        try:
            outcome["result"] = services.invocation_submit(function=ECHO, queue="b")
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc
        finally:
            with lock:
                log.append("submit returned")
            returned.set()
            connection.close()

    submitter = threading.Thread(target=submit)
    submitter.start()
    assert started.wait(10)
    # A submit that does not block (rejects, or admits past max_depth) comes back at
    # once: give it the chance. A blocked one cannot come back while the queue is full.
    assert not returned.wait(0.5), outcome
    queued = Invocation.objects.filter(queue="b", state="queued")
    assert list(queued.values_list("id", flat=True)) == [first.pk]  # nothing admitted
    assert not returned.is_set(), outcome  # still waiting, just before the room is made
    with lock:
        log.append("making room")
    assert services.invocation_bulk_cancel(queue="b") == 1
    assert returned.wait(30), "the blocked submit never came back after room was made"
    submitter.join(10)
    assert log == ["making room", "submit returned"]
    assert "error" not in outcome, outcome["error"]
    inv, created = outcome["result"]
    assert created and inv.state == "queued" and inv.pk != first.pk
    assert list(queued.values_list("id", flat=True)) == [inv.pk]


def test_a_full_blocking_queue_gives_up_after_the_timeout(operator, settings):
    builders.queue(name="b", max_depth=1, on_full="block")
    services.invocation_submit(function=ECHO, queue="b")
    started = time.monotonic()
    with pytest.raises(services.BacklogFull) as refused:
        services.invocation_submit(function=ECHO, queue="b", block_timeout=0.3)
    # a lower bound only (it gave up no sooner than its timeout), never a window
    assert time.monotonic() - started >= 0.3
    assert (refused.value.status, refused.value.code) == (429, "backlog_full")
    assert refused.value.extra["depth"] == 1 and refused.value.extra["max_depth"] == 1
    # the same through the API: 429 backlog_full with the depth, nothing admitted
    settings.LAKESHORE_BLOCK_TIMEOUT = 0.3
    response = operator.post("/api/v1/jobs/", {"function": ECHO, "queue": "b"}, format="json")
    body = _error(response, 429, "backlog_full")
    assert body["depth"] == 1 and "full" in body["message"]
    assert Invocation.objects.filter(queue="b").count() == 1


def test_a_batch_is_admitted_whole_or_not_at_all(operator):
    builders.queue(name="small", max_depth=2)
    batch = [{"function": ECHO, "queue": "small"} for _ in range(3)]
    _error(operator.post("/api/v1/jobs/", batch, format="json"), 429)
    assert Invocation.objects.count() == 0
    response = operator.post("/api/v1/jobs/", batch[:2], format="json")
    assert response.status_code == 201 and len(response.json()) == 2


# ---------------------------------------------------------------------------- list / show


def test_it_lists_newest_first_with_filters(operator):
    builders.queue(name="a")
    first, _ = services.invocation_submit(function=ECHO, queue="a")
    second, _ = services.invocation_submit(function=ECHO)
    daemon = builders.daemon(queues=["a"])
    builders.claim(daemon=daemon)
    rows = operator.get("/api/v1/jobs/").json()
    assert [r["id"] for r in rows] == [str(second.pk), str(first.pk)]
    running = operator.get("/api/v1/jobs/?state=running&state=queued").json()
    assert len(running) == 2
    for name in ("daemon", "worker"):  # worker: the cookbook's name for the same filter
        found = operator.get(f"/api/v1/jobs/?{name}={daemon.pk}").json()
        assert [r["id"] for r in found] == [str(first.pk)]
    assert operator.get(f"/api/v1/jobs/?daemon={daemon.pk + 1}").json() == []
    assert [r["id"] for r in operator.get("/api/v1/jobs/?queue=a").json()] == [str(first.pk)]
    assert operator.get("/api/v1/jobs/?state=succeeded").json() == []


@pytest.mark.parametrize(
    "query",
    ["limit=0", "limit=201", "offset=-1", "limit=ten", "state=done", "worker=abc", "daemon=abc"],
)
def test_it_refuses_out_of_range_list_parameters(operator, query):
    _error(operator.get(f"/api/v1/jobs/?{query}"), 400, "invalid")


def test_it_pages_with_offset_and_a_keyset_cursor(operator):
    Invocation.objects.bulk_create([Invocation(function="x.y") for _ in range(5)])
    ids = [str(pk) for pk in Invocation.objects.order_by("-id").values_list("id", flat=True)]
    page = operator.get("/api/v1/jobs/?limit=2&offset=2")
    assert [r["id"] for r in page.json()] == ids[2:4]
    walked, url = [], "/api/v1/jobs/?limit=2"
    while url:
        response = operator.get(url)
        walked += [r["id"] for r in response.json()]
        link = response.headers.get("Link")
        url = (
            link[link.index("<") + 1 : link.index(">")].replace("http://localhost", "")
            if link
            else None
        )
    assert walked == ids


def test_the_list_costs_the_same_queries_for_1_and_50_rows(operator):
    def count():
        with CaptureQueriesContext(connection) as ctx:
            assert operator.get("/api/v1/jobs/").status_code == 200
        return len(ctx)

    operator.get("/api/v1/jobs/")  # the token's first use records last_used_at once
    Invocation.objects.create(function="x.y")
    one = count()
    daemon = builders.daemon()
    Invocation.objects.bulk_create(
        [Invocation(function="x.y", daemon=daemon, state="running") for _ in range(49)]
    )
    assert count() == one


def test_show_gives_a_queued_invocations_position(operator):
    builders.queue(name="p", kind="priority")
    low, _ = services.invocation_submit(function=ECHO, queue="p", priority=1)
    services.invocation_submit(function=ECHO, queue="p", priority=5)
    services.invocation_submit(function=ECHO, queue="p", priority=1)
    body = operator.get(f"/api/v1/jobs/{low.pk}/").json()
    assert body["position"] == {"ahead": 1, "exact": True, "capped": False}


def test_show_gives_an_expected_position_for_boltzmann(operator):
    builders.queue(name="b", kind="boltzmann")
    services.invocation_submit(function=ECHO, queue="b", priority=0)
    mine, _ = services.invocation_submit(function=ECHO, queue="b", priority=0)
    position = operator.get(f"/api/v1/jobs/{mine.pk}/").json()["position"]
    assert position["exact"] is False and position["ahead"] == 1.0


def test_show_costs_the_same_queries_whatever_the_backlog(operator):
    builders.queue(name="f")

    def count(pk):
        with CaptureQueriesContext(connection) as ctx:
            assert operator.get(f"/api/v1/jobs/{pk}/").status_code == 200
        return len(ctx)

    first, _ = services.invocation_submit(function=ECHO, queue="f")
    operator.get("/api/v1/jobs/")  # the token's first use records last_used_at once
    one = count(first.pk)
    Invocation.objects.bulk_create([Invocation(function="x.y", queue="f") for _ in range(50)])
    last = Invocation.objects.order_by("-id").first()
    assert count(last.pk) == one


def test_show_answers_404_for_unknown_ids(operator):
    _error(operator.get("/api/v1/jobs/999999/"), 404, "not_found")
    _error(operator.get("/api/v1/jobs/abc/"), 404, "not_found")


# ---------------------------------------------------------------------------- kill / cancel


def test_kill_marks_a_queued_invocation_killed_at_once(operator):
    inv, _ = services.invocation_submit(function=ECHO)
    response = operator.post(f"/api/v1/jobs/{inv.pk}/kill/", {"reason": "oops"}, format="json")
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["reason"]) == ("killed", "oops")


def test_kill_of_a_running_invocation_says_to_drop_the_daemon(operator):
    inv, _ = services.invocation_submit(function=ECHO)
    daemon = builders.daemon()
    builders.claim(daemon=daemon)
    body = _error(operator.post(f"/api/v1/jobs/{inv.pk}/kill/"), 409, "invocation_running")
    assert "drop the daemon" in body["message"] and str(daemon.pk) in body["message"]


def test_kill_of_a_finished_invocation_is_a_conflict(operator):
    inv, _ = services.invocation_submit(function=ECHO)
    operator.post(f"/api/v1/jobs/{inv.pk}/kill/")
    body = _error(operator.post(f"/api/v1/jobs/{inv.pk}/kill/"), 409)
    assert "already finished" in body["message"]


def test_bulk_cancel_touches_only_queued_rows(operator):
    builders.queue(name="a")
    services.invocation_submit(function=ECHO, queue="a")
    services.invocation_submit(function=ECHO, queue="a")
    services.invocation_submit(function=ECHO)
    daemon = builders.daemon(queues=["a"])
    (running,) = builders.claim(daemon=daemon)
    dry = operator.post("/api/v1/jobs/bulk-cancel/", {"queue": "a", "dry_run": True}, format="json")
    assert dry.json() == {"cancelled": 1, "dry_run": True, "queue": "a"}
    assert Invocation.objects.filter(state="queued").count() == 2
    done = operator.post("/api/v1/jobs/bulk-cancel/", {"queue": "a"}, format="json")
    assert done.json()["cancelled"] == 1
    assert operator.post("/api/v1/jobs/bulk-cancel/", {}, format="json").json()["cancelled"] == 1
    running.refresh_from_db()
    assert running.state == "running"
    _error(operator.post("/api/v1/jobs/bulk-cancel/", {"queue": "nope"}, format="json"), 404)


# ---------------------------------------------------------------------------- daemon protocol


def test_a_daemon_token_acts_only_for_its_own_daemon(daemon_client):
    builders.queue(name="a")
    mine = builders.register(daemon_client, {"name": "gpu-1", "queues": ["a"]}).json()
    other = APIClient(SERVER_NAME="localhost")
    other.credentials(**builders.auth(builders.token("daemon")))
    _error(other.post(f"/api/v1/daemons/{mine['id']}/claim/", {}, format="json"), 403)
    _error(other.post(f"/api/v1/daemons/{mine['id']}/heartbeat/"), 403)
    assert daemon_client.post(f"/api/v1/daemons/{mine['id']}/heartbeat/").status_code == 200
    # and a daemon token cannot read or steer queues and jobs
    _error(daemon_client.get("/api/v1/jobs/"), 403)
    _error(daemon_client.post("/api/v1/jobs/bulk-cancel/", {}, format="json"), 403)


def test_the_daemon_protocol_round_trip(daemon_client):
    builders.queue(name="a")
    inv, _ = services.invocation_submit(function=ECHO, queue="a", args=["hi"])
    me = builders.register(daemon_client, {"name": "w", "queues": ["a"]}).json()
    claimed = daemon_client.post(
        f"/api/v1/daemons/{me['id']}/claim/", {"limit": 5}, format="json"
    ).json()
    assert [c["id"] for c in claimed] == [str(inv.pk)] and claimed[0]["attempts"] == 1
    beat = daemon_client.post(f"/api/v1/daemons/{me['id']}/heartbeat/").json()
    assert beat == {"state": "busy", "running": [str(inv.pk)], "commands": []}
    done = daemon_client.post(
        f"/api/v1/daemons/{me['id']}/complete/",
        {"invocation": inv.pk, "attempt": 1, "state": "succeeded", "result": ["hi"]},
        format="json",
    )
    assert done.status_code == 200 and done.json()["result"] == ["hi"]
    again = daemon_client.post(
        f"/api/v1/daemons/{me['id']}/complete/",
        {"invocation": inv.pk, "attempt": 1, "state": "failed", "error": "late"},
        format="json",
    )
    _error(again, 409, "already_completed")
    inv.refresh_from_db()
    assert inv.state == "succeeded"


def test_dropping_a_daemon_kills_its_running_invocation(operator):
    inv, _ = services.invocation_submit(function=ECHO)
    daemon = builders.daemon()
    builders.claim(daemon=daemon)
    assert operator.delete(f"/api/v1/daemons/{daemon.pk}/").status_code == 200
    inv.refresh_from_db()
    daemon.refresh_from_db()
    assert (inv.state, daemon.state) == ("killed", "terminated")
    _error(operator.post(f"/api/v1/daemons/{daemon.pk}/claim/", {}, format="json"), 409)


@pytest.mark.parametrize("query", ["cursor=1.5", "cursor=100000000000000000000000", "worker=0"])
def test_list_ids_must_be_whole_numbers_in_range(operator, query):
    _error(operator.get(f"/api/v1/jobs/?{query}"), 400, "invalid")
