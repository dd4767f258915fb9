"""GET /api/v1/queues/NAME/stats/ — `lakeshore queues stats`."""

import pytest

from fleet.models import DaemonState
from jobs.models import Invocation
from tests.queues.events import events
from tests.support import builders
from tests.support.assertions import assert_error
from tests.support.shapes import EVENT_KEYS, STATS_KEYS

pytestmark = pytest.mark.django_db


def stats(client, name: str = "q") -> dict:
    response = client.get(f"/api/v1/queues/{name}/stats/")
    assert response.status_code == 200, response.json()
    return response.json()


def queued(count: int, queue: str = "q", state: str = "queued") -> None:
    Invocation.objects.bulk_create(
        Invocation(queue=queue, function="lakeshore.functions.echo", state=state)
        for _ in range(count)
    )


def daemons(count: int, state: str = DaemonState.IDLE, queue: str = "q") -> None:
    for _ in range(count):
        builders.daemon(queues=[queue], state=state)


def elastic_queue(spec: dict, *, provider: bool = True, name: str = "q"):
    return builders.queue(
        name=name,
        elasticity_spec=spec,
        provider=builders.provider().name if provider else None,
    )


def test_it_shows_the_signals(operator):
    elastic_queue({"kind": "pool_with_threshold", "min": 2, "max": 16, "threshold": 0.7})
    daemons(3, DaemonState.BUSY)
    daemons(1, DaemonState.IDLE)
    daemons(1, DaemonState.PROVISIONING)
    daemons(1, DaemonState.DRAINING)
    daemons(1, DaemonState.TERMINATED)
    daemons(2, DaemonState.BUSY, queue="elsewhere")
    queued(4)
    queued(3, state="running")
    queued(2, state="succeeded")
    queued(5, queue="elsewhere")

    body = stats(operator)

    assert set(body) >= STATS_KEYS
    assert body["daemons"] == 5  # provisioning, idle or busy
    assert body["busy"] == 3
    assert body["idle"] == 1
    assert body["provisioning"] == 1
    assert body["utilization"] == pytest.approx(3 / 5)
    assert body["pending"] == 4
    assert body["running"] == 3
    assert body["desired"] == 10  # ceil((3 + 4) / 0.7)
    assert body["next_action"] == "launch 5"
    assert body["recent_actions"] == []


def test_an_empty_queue_has_zero_utilization(operator):
    elastic_queue({"kind": "fully_elastic"})

    body = stats(operator)

    assert (body["daemons"], body["busy"], body["pending"], body["running"]) == (0, 0, 0, 0)
    assert body["utilization"] == 0
    assert body["desired"] == 0
    assert body["next_action"] == "none"


@pytest.mark.parametrize(
    "busy, pending, desired",
    [(0, 0, 2), (0, 1, 2), (1, 6, 10), (0, 14, 16), (0, 100, 16)],
)
def test_pool_with_threshold_keeps_utilization_under_the_threshold(
    operator, busy, pending, desired
):
    elastic_queue({"kind": "pool_with_threshold", "min": 2, "max": 16, "threshold": 0.7})
    daemons(busy, DaemonState.BUSY)
    queued(pending)

    assert stats(operator)["desired"] == desired


def test_pool_with_threshold_rounds_an_exact_quotient_exactly(operator):
    elastic_queue({"kind": "pool_with_threshold", "max": 40, "threshold": 0.7})
    queued(21)

    assert stats(operator)["desired"] == 30  # 21 busy of 30 is exactly 0.7


@pytest.mark.parametrize("busy, pending", [(0, 0), (2, 9)])
def test_fixed_wants_min(operator, busy, pending):
    elastic_queue({"kind": "fixed", "min": 3})
    daemons(busy, DaemonState.BUSY)
    queued(pending)

    assert stats(operator)["desired"] == 3


@pytest.mark.parametrize("busy, pending, desired", [(0, 0, 1), (1, 3, 4), (2, 10, 5)])
def test_fully_elastic_follows_the_work_between_min_and_max(operator, busy, pending, desired):
    elastic_queue({"kind": "fully_elastic", "min": 1, "max": 5})
    daemons(busy, DaemonState.BUSY)
    queued(pending)

    assert stats(operator)["desired"] == desired


def test_fully_elastic_without_max_is_unbounded(operator):
    elastic_queue({"kind": "fully_elastic"})
    queued(40)

    body = stats(operator)

    assert body["desired"] == 40
    assert body["next_action"] == "launch 10"  # LAKESHORE_MAX_LAUNCH_PER_TICK


@pytest.mark.parametrize("busy, pending, desired", [(0, 0, 0), (1, 1, 2), (2, 9, 4)])
def test_max_count_follows_the_work_up_to_max(operator, busy, pending, desired):
    elastic_queue({"kind": "max_count", "max": 4})
    daemons(busy, DaemonState.BUSY)
    queued(pending)

    assert stats(operator)["desired"] == desired


def test_it_plans_to_terminate_idle_daemons_above_desired(operator):
    elastic_queue({"kind": "fixed", "min": 1})
    daemons(3)

    body = stats(operator)

    assert body["desired"] == 1
    assert body["next_action"] == "terminate up to 2 idle"


def test_recent_actions_are_the_last_five_decisions(operator):
    q = elastic_queue({"kind": "fixed", "min": 0})
    rows = events(q, ["scale_up", "hold", "tick_noop", "scale_down", "launch_failed"] * 2)
    decisions = [e for e in reversed(rows) if e.action != "tick_noop"][:5]

    recent = stats(operator)["recent_actions"]

    assert [e["id"] for e in recent] == [str(e.pk) for e in decisions]
    assert "tick_noop" not in {e["action"] for e in recent}
    assert set(recent[0]) == EVENT_KEYS


def test_a_paused_queue_holds(operator):
    elastic_queue({"kind": "fully_elastic"})
    queued(5)
    operator.post("/api/v1/queues/q/pause/")

    body = stats(operator)

    assert "hold" in body["next_action"]
    assert body["desired"] == 0  # its current size


def test_a_queue_without_a_provider_says_it_cannot_launch(operator):
    elastic_queue({"kind": "fixed", "min": 3}, provider=False)

    body = stats(operator)

    assert body["desired"] == 3
    assert "no provider" in body["next_action"]
    assert "3" in body["next_action"]
    assert not body["next_action"].startswith("launch")


def test_a_queue_without_elasticity_wants_what_it_has(operator):
    builders.queue(name="q")
    daemons(2)
    queued(7)

    body = stats(operator)

    assert body["desired"] == 2
    assert "no elasticity" in body["next_action"]


@pytest.mark.parametrize("action", ["archive", "drain"])
def test_archived_and_drained_queues_scale_to_zero(operator, action):
    elastic_queue({"kind": "fixed", "min": 2})
    daemons(2)
    operator.post(f"/api/v1/queues/q/{action}/")

    body = stats(operator)

    assert body["desired"] == 0
    assert body["next_action"].startswith("terminate up to 2 idle")


def test_it_answers_404_for_an_unknown_queue(operator):
    assert_error(operator.get("/api/v1/queues/nope/stats/"), 404, "not_found", says="nope")


def test_the_default_queue_has_stats_and_no_events(operator):
    """The default queue has no name: its address is '(default)' (`queues stats ""`)."""
    queued(2, queue="")
    queued(1, queue="", state="running")
    builders.daemon(queues=[], state=DaemonState.BUSY)
    builders.daemon(queues=["q"], state=DaemonState.IDLE)  # another queue's: not counted
    body = stats(operator, "(default)")
    assert (body["queue"], body["state"], body["pending"], body["running"]) == ("", "active", 2, 1)
    assert (body["daemons"], body["busy"]) == (1, 1)
    assert body["next_action"] == "none (no elasticity declared)"
    answer = operator.get("/api/v1/queues/(default)/events/?verbose=1")
    assert answer.status_code == 200 and answer.json() == []
    assert operator.get("/api/v1/queues/default/stats/").status_code == 404  # no such name
