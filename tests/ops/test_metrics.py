"""GET /metrics — Prometheus's text format: who may read it, the per-queue gauges
against the queue's stats, and the counters and histograms against the database after
real work. The counters' totals are rows of the test's database (MetricTotal), rolled
back with it; the tests' settings write this process's counts only at a scrape it
serves (no flush thread). Each test still compares what it changed: after minus before.
Servers in processes of their own: tests/ops/test_metrics_multiprocess.py and
tests/ops/test_two_servers.py."""

from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.db.models import F, Sum
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from accounts.models import ApiToken, hash_token
from fleet import controller, daemons, protocol
from fleet.models import Daemon, DaemonState, Provider
from jobs import services
from jobs.models import Invocation
from jobs.transitions import kill
from jobs.transitions.states import TERMINAL
from queues import metrics as collector
from queues import services as queue_services
from queues.models import QueueEvent
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

ECHO = "lakeshore.functions.echo"
ENDED = "lakeshore_invocations_ended_total"
CLAIMED = "lakeshore_invocations_claimed_total"
WAITS = "lakeshore_invocation_queue_wait_seconds_count"
RUNS = "lakeshore_invocation_run_seconds_count"
RUN_SECONDS = "lakeshore_invocation_run_seconds_sum"
ACTIONS = "lakeshore_controller_actions_total"


@pytest.fixture(autouse=True)
def _no_back_off(settings):
    """A failure with an attempt left can be claimed again at once."""
    settings.LAKESHORE_RETRY_BACKOFF = 0


def parse(text: str) -> dict[tuple, float]:
    """{(sample name, (label, value), …): value} of a scrape, read by prometheus_client."""
    return {
        (sample.name, *sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(client) -> dict[tuple, float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    return parse(response.content.decode())


def value(samples: dict, name: str, **labels) -> float:
    """A counter's value (0 before its first count)."""
    return samples.get((name, *sorted(labels.items())), 0.0)


def gauge(samples: dict, name: str, **labels) -> float:
    """A gauge's value, which must be there."""
    return samples[(name, *sorted(labels.items()))]


def delta(before: dict, after: dict, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


# ---------------------------------------------------------------------------- access


def test_it_needs_a_token():
    response = APIClient().get("/metrics")

    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("role", ["daemon", "none"])
def test_a_token_without_a_read_role_gets_403(role):
    raw = builders.token("daemon" if role == "daemon" else "viewer")
    if role == "none":  # a user whose role was taken away
        ApiToken.objects.get(digest=hash_token(raw)).user.groups.clear()
    client = APIClient()
    client.credentials(**builders.auth(raw))

    assert_error(client.get("/metrics"), 403, "permission_denied", says="viewer")


def test_a_bad_token_gets_401():
    client = APIClient()
    client.credentials(**builders.auth("not-a-token"))

    assert_error(client.get("/metrics"), 401, "authentication_failed")


def test_a_viewer_reads_it(viewer):
    builders.queue(name="q")

    response = viewer.get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"`Content-Type: {response['Content-Type']}`" in readme  # the README says the truth
    families = {f.name: f.type for f in text_string_to_metric_families(response.content.decode())}
    assert families["lakeshore_queue_pending"] == "gauge"
    assert families["lakeshore_queue_oldest_pending_age_seconds"] == "gauge"


def test_it_is_open_to_anyone_when_public(settings):
    builders.queue(name="q")
    services.invocation_submit(function=ECHO, queue="q")
    settings.LAKESHORE_METRICS_PUBLIC = True

    samples = scrape(APIClient())

    assert gauge(samples, "lakeshore_queue_pending", queue="q") == 1
    settings.LAKESHORE_METRICS_PUBLIC = False  # read at each request
    assert APIClient().get("/metrics").status_code == 401


def test_it_only_reads(operator):
    assert_error(operator.post("/metrics", {}), 405, "method_not_allowed")


# ---------------------------------------------------------------------------- gauges


def gauges(samples: dict, queue: str) -> dict:
    found = {
        "pending": gauge(samples, "lakeshore_queue_pending", queue=queue),
        "running": gauge(samples, "lakeshore_queue_running", queue=queue),
        "utilization": gauge(samples, "lakeshore_queue_utilization", queue=queue),
        "desired": samples.get(("lakeshore_queue_desired_daemons", ("queue", queue))),
    }
    for state in ("provisioning", "idle", "busy", "draining"):
        found[state] = gauge(samples, "lakeshore_queue_daemons", queue=queue, state=state)
    found["daemons"] = found["provisioning"] + found["idle"] + found["busy"]
    return found


def stats(client, queue: str) -> dict:
    response = client.get(f"/api/v1/queues/{queue}/stats/")
    assert response.status_code == 200, response.content
    body = response.json()
    keys = ("pending", "running", "utilization", "desired", "provisioning", "idle", "busy")
    return {key: body[key] for key in (*keys, "draining", "daemons")}


def test_the_queue_gauges_match_the_queues_stats(viewer):
    builders.provider(name="sim", kind="simulated")
    builders.queue(
        name="elastic",
        provider="sim",
        elasticity_spec={"kind": "pool_with_threshold", "min": 1, "max": 8, "threshold": 0.5},
    )
    builders.queue(name="plain")
    builders.queue(name="empty")
    for queue, state, n in [
        ("elastic", DaemonState.BUSY, 2),
        ("elastic", DaemonState.IDLE, 1),
        ("elastic", DaemonState.DRAINING, 1),
        ("elastic", DaemonState.TERMINATED, 3),
        ("plain", DaemonState.IDLE, 2),
        ("plain", DaemonState.PROVISIONING, 1),
    ]:
        for _ in range(n):
            builders.daemon(queues=[queue], state=state)
    for queue, n in [("elastic", 5), ("plain", 4)]:
        for i in range(n):
            services.invocation_submit(function=ECHO, queue=queue, args=[i])
    worker = builders.daemon(queues=["plain"], state=DaemonState.IDLE)
    builders.claim(daemon=worker, limit=3)
    Invocation.objects.filter(queue="plain", state="queued").update(
        created_at=timezone.now() - timedelta(minutes=10)
    )

    before_tick = scrape(viewer)
    # A queue with elasticity shows what the controller decided: nothing before a tick.
    assert ("lakeshore_queue_desired_daemons", ("queue", "elastic")) not in before_tick
    controller.tick()
    samples = scrape(viewer)

    for queue in ("elastic", "plain", "empty"):
        assert gauges(samples, queue) == pytest.approx(stats(viewer, queue)), queue
    assert gauges(samples, "elastic")["desired"] == 8  # ceil((busy 2 + pending 5) / 0.5)
    assert gauges(samples, "plain")["running"] == 3
    assert gauge(samples, "lakeshore_queue_info", queue="plain", state="active") == 1
    age = gauge(samples, "lakeshore_queue_oldest_pending_age_seconds", queue="plain")
    assert 600 <= age < 660
    assert gauge(samples, "lakeshore_queue_oldest_pending_age_seconds", queue="empty") == 0


def test_the_default_queue_has_its_gauges_as_queue_empty(viewer):
    """queue="": the same figures as its stats, so LakeshoreBacklogWaiting fires for it."""
    builders.queue(name="named")
    builders.daemon(queues=[], state=DaemonState.BUSY)
    builders.daemon(queues=[], state=DaemonState.DRAINING)
    builders.daemon(queues=["named"], state=DaemonState.IDLE)  # not the default queue's
    for i in range(3):
        services.invocation_submit(function=ECHO, args=[i])
    Invocation.objects.filter(queue="").update(created_at=timezone.now() - timedelta(minutes=20))
    builders.claim(daemon=builders.daemon(queues=[]), limit=1)
    samples = scrape(viewer)
    assert gauges(samples, "") == pytest.approx(stats(viewer, "(default)"))
    figures = gauges(samples, "")
    assert (figures["pending"], figures["running"], figures["busy"]) == (2, 1, 2)
    assert (figures["draining"], figures["idle"], figures["desired"]) == (1, 0, 2)
    assert gauge(samples, "lakeshore_queue_info", queue="", state="active") == 1
    age = gauge(samples, "lakeshore_queue_oldest_pending_age_seconds", queue="")
    assert 1200 <= age < 1260  # past the README alert's 900 s
    assert gauges(samples, "named")["idle"] == 1 and gauges(samples, "named")["busy"] == 0


def test_the_default_queue_with_nothing_queued_is_all_zeros(viewer):
    samples = scrape(viewer)
    assert gauge(samples, "lakeshore_queue_pending", queue="") == 0
    assert gauge(samples, "lakeshore_queue_oldest_pending_age_seconds", queue="") == 0
    assert gauge(samples, "lakeshore_queue_daemons", queue="", state="idle") == 0


def test_the_scrape_costs_the_same_queries_for_1_and_20_queues(
    viewer, django_capture_on_commit_callbacks
):
    def busy_queues(names):
        """Daemons, pending and running work; every other queue with elasticity (whose
        desired comes from its latest event, never from a per-queue plan). Counted (the
        claims, their waits, the controller's events), not yet written."""
        with django_capture_on_commit_callbacks(execute=True):
            for i, name in enumerate(names):
                builders.queue(
                    name=name, elasticity_spec={"kind": "fixed", "min": 1} if i % 2 else None
                )
                builders.daemon(queues=[name], state=DaemonState.IDLE)
                builders.daemon(queues=[name], state=DaemonState.BUSY)
                services.invocation_submit(function=ECHO, queue=name)
                services.invocation_submit(function=ECHO, queue=name)
                builders.claim(daemon=builders.daemon(queues=[name]))
            controller.tick()

    def queries() -> tuple[list[str], int]:
        with CaptureQueriesContext(connection) as rendered:
            collector.render()  # writes what busy_queues counted, then reads
        with CaptureQueriesContext(connection) as whole:
            assert viewer.get("/metrics").status_code == 200  # nothing left to write
        return [query["sql"].split()[0].strip("(") for query in rendered.captured_queries], len(
            whole
        )

    viewer.get("/metrics")  # the token's first use is written down once
    busy_queues(["q-0"])
    one = queries()
    busy_queues([f"q-{i}" for i in range(1, 20)])
    twenty = queries()

    assert one == twenty
    # this process's counts (one INSERT), the totals, the queues, running invocations,
    # live daemons
    assert one[0] == ["INSERT", "SELECT", "SELECT", "SELECT", "SELECT"]
    samples = parse(collector.render().decode())
    assert gauge(samples, "lakeshore_queue_running", queue="q-19") == 1
    for i in range(20):
        assert value(samples, CLAIMED, queue=f"q-{i}") == 1
        assert value(samples, WAITS, queue=f"q-{i}") == 1
    written = Counter(QueueEvent.objects.values_list("queue__name", "action"))
    assert len(written) == 9  # the queues with elasticity (every other one after q-0)
    for (queue, action), n in written.items():
        assert value(samples, ACTIONS, queue=queue, action=action) == n, (queue, action)


# ---------------------------------------------------------------------------- counters


def ended_in_db() -> Counter:
    ended = Invocation.objects.filter(state__in=TERMINAL)
    return Counter(ended.values_list("queue", "state"))


def test_the_counters_match_the_database_after_real_work(
    viewer, operator, django_capture_on_commit_callbacks
):
    """Submit, claim and complete through the daemon API, kill, bulk-cancel, drop a
    daemon, lose one, reap a timeout: every counter moves by what the database shows."""
    bootstrap = builders.token("daemon")
    for name in ("a", "b", "c"):
        builders.queue(name=name)
    before = scrape(viewer)

    with django_capture_on_commit_callbacks(execute=True):
        for queue, n in [("a", 6), ("b", 5), ("c", 4), ("", 2)]:
            for i in range(n):
                services.invocation_submit(function=ECHO, queue=queue, args=[i], max_attempts=2)

        speakers = {}  # daemon id → a client speaking with its own credential

        def register(queues: list[str]) -> str:
            client = APIClient()
            client.credentials(**builders.auth(bootstrap))
            response = builders.register(client, {"name": "w", "queues": queues})
            speakers[response.json()["id"]] = client
            return response.json()["id"]

        def claim(daemon: str, limit: int) -> list[dict]:
            response = speakers[daemon].post(
                f"/api/v1/daemons/{daemon}/claim/", {"limit": limit}, format="json"
            )
            return response.json()

        def complete(daemon: str, claimed: list[dict], states: list[str], **extra) -> None:
            outcomes = [
                {"invocation": c["id"], "attempt": 1, "state": s, "result": 1, "error": "x"}
                for c, s in zip(claimed, states, strict=False)
            ]
            outcomes = [{**outcome, **extra} for outcome in outcomes]
            response = speakers[daemon].post(
                f"/api/v1/daemons/{daemon}/complete/", outcomes, format="json"
            )
            assert response.status_code == 200, response.content
            assert all(answer["ok"] for answer in response.json()), response.json()

        # a: three succeed, one times out, two fail with an attempt left (requeued, not
        # ended), are claimed again and still run
        on_a = register(["a"])
        claimed = claim(on_a, 8)
        assert len(claimed) == 6
        complete(on_a, claimed, ["succeeded", "succeeded", "failed", "timeout", "succeeded"])
        complete(on_a, claimed[5:], ["failed"])
        assert len(claim(on_a, 8)) == 2  # attempt 2 (no back-off in these tests)
        # the default queue: one fails for good (retry False), one still runs
        on_default = register([])
        claimed = claim(on_default, 8)
        assert len(claimed) == 2
        complete(on_default, claimed[:1], ["failed"], retry=False)
        # b: two killed one by one, the rest bulk-cancelled
        for row in Invocation.objects.filter(queue="b")[:2]:
            assert operator.post(f"/api/v1/jobs/{row.pk}/kill/").status_code == 200
        assert services.invocation_bulk_cancel(queue="b") == 3
        # c: one worker dropped (its job killed), one lost (its last attempt fails),
        # one past its timeout (reaped)
        for name in ("dropped", "lost", "slow"):
            daemon = builders.daemon(queues=["c"], name=name)
            builders.claim(daemon=daemon)
        Invocation.objects.filter(queue="c", daemon__name="lost").update(max_attempts=1)
        Invocation.objects.filter(queue="c", daemon__name="slow").update(
            timeout_s=1, started_at=timezone.now() - timedelta(seconds=30)
        )
        dropped = Daemon.objects.get(name="dropped").pk
        assert operator.delete(f"/api/v1/daemons/{dropped}/").status_code == 200
        Daemon.objects.filter(name="lost").update(state=DaemonState.LOST)
        daemons.reap()

    after = scrape(viewer)
    in_db = ended_in_db()
    assert in_db == {
        ("a", "succeeded"): 3,
        ("a", "timeout"): 1,
        ("", "failed"): 1,  # retry False: ended at once
        ("b", "killed"): 5,
        ("c", "killed"): 1,
        ("c", "failed"): 1,
        ("c", "timeout"): 1,
    }
    for state in ("succeeded", "failed", "timeout", "killed"):
        for queue in ("a", "b", "c", ""):
            seen = delta(before, after, ENDED, queue=queue, state=state)
            assert seen == in_db[queue, state], (queue, state)
    states = {dict(labels)["state"] for name, *labels in after if name == ENDED}
    assert states <= {"succeeded", "failed", "timeout", "killed"}  # a requeue is no end
    attempts = dict(Invocation.objects.order_by().values_list("queue").annotate(n=Sum("attempts")))
    assert attempts == {"a": 8, "b": 0, "c": 3, "": 2}
    for queue, n in attempts.items():
        assert delta(before, after, CLAIMED, queue=queue) == n, queue
        assert delta(before, after, WAITS, queue=queue) == n, queue
    ran = Invocation.objects.filter(state__in=TERMINAL, started_at__isnull=False)
    for queue in ("a", "b", "c", ""):
        mine = ran.filter(queue=queue)
        assert delta(before, after, RUNS, queue=queue) == mine.count(), queue
        seconds = sum((r.finished_at - r.started_at).total_seconds() for r in mine)
        assert delta(before, after, RUN_SECONDS, queue=queue) == pytest.approx(seconds)
    assert delta(before, after, RUN_SECONDS, queue="c") >= 29  # the reaped one ran 30 s


def test_the_histograms_buckets_add_up_to_their_count(viewer, django_capture_on_commit_callbacks):
    builders.queue(name="h")
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(3):
            services.invocation_submit(function=ECHO, queue="h")
        builders.claim(daemon=builders.daemon(queues=["h"]), limit=3)

    samples = scrape(viewer)

    buckets = {
        dict(labels)["le"]: v
        for (name, *labels), v in samples.items()
        if name == "lakeshore_invocation_queue_wait_seconds_bucket" and ("queue", "h") in labels
    }
    assert buckets["+Inf"] == value(samples, WAITS, queue="h") >= 3
    assert list(buckets.values()) == sorted(buckets.values())  # cumulative


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_change_counts_nothing(viewer):
    """Real commits and a real rollback (no captured callbacks)."""
    builders.queue(name="r")
    queued = [services.invocation_submit(function=ECHO, queue="r")[0] for _ in range(3)]
    daemon = builders.daemon(queues=["r"])

    before = scrape(viewer)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert builders.claim(daemon=daemon, limit=1)
        assert kill.kill_queued(invocation_id=queued[1].pk, reason="rolled back")
        raise RuntimeError("the caller fails after the statements")
    rolled_back = scrape(viewer)
    with transaction.atomic():
        assert kill.kill_queued(invocation_id=queued[2].pk, reason="committed")
    committed = scrape(viewer)

    assert Invocation.objects.filter(state="queued").count() == 2
    assert delta(before, rolled_back, CLAIMED, queue="r") == 0
    assert delta(before, rolled_back, ENDED, queue="r", state="killed") == 0
    assert delta(rolled_back, committed, ENDED, queue="r", state="killed") == 1


def test_the_controller_actions_are_counted_by_kind(viewer, django_capture_on_commit_callbacks):
    builders.provider(name="good", kind="simulated")
    builders.provider(name="bad", kind="simulated")
    fixed = {"kind": "fixed", "min": 1}
    builders.queue(name="grows", provider="good", elasticity_spec=fixed)
    builders.queue(name="paused", provider="good", elasticity_spec=fixed)
    queue_services.queue_transition(name="paused", action="pause")
    builders.queue(name="broken", provider="bad", elasticity_spec=fixed)
    Provider.objects.filter(name="bad").update(config={"startup_seconds": "abc"})
    before = scrape(viewer)

    with django_capture_on_commit_callbacks(execute=True):
        controller.tick()
        controller.tick()  # grows: nothing more to do; broken: backing off, no event;
        # paused: the same hold again, which a tick does not write twice

    after = scrape(viewer)
    written = Counter(QueueEvent.objects.values_list("queue__name", "action"))
    assert written == {
        ("grows", "scale_up"): 1,
        ("grows", "tick_noop"): 1,
        ("paused", "hold"): 1,
        ("broken", "tick_failed"): 1,
    }
    for (queue, action), n in written.items():
        assert delta(before, after, ACTIONS, queue=queue, action=action) == n, (queue, action)


def test_what_ran_is_timed_from_claim_to_end(viewer, django_capture_on_commit_callbacks):
    builders.queue(name="t")
    inv, _ = services.invocation_submit(function=ECHO, queue="t")
    daemon = builders.daemon(queues=["t"])
    before = scrape(viewer)
    with django_capture_on_commit_callbacks(execute=True):
        builders.claim(daemon=daemon)
        Invocation.objects.filter(pk=inv.pk).update(started_at=F("started_at") - timedelta(7))
        protocol.invocation_complete(daemon=daemon, invocation_id=inv.pk, attempt=1)

    after = scrape(viewer)
    assert delta(before, after, RUN_SECONDS, queue="t") == pytest.approx(7 * 86400, abs=5)
    assert (
        delta(before, after, "lakeshore_invocation_run_seconds_bucket", queue="t", le="+Inf") == 1
    )
    assert (
        delta(before, after, "lakeshore_invocation_run_seconds_bucket", queue="t", le="86400.0")
        == 0
    )
