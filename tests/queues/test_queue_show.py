"""GET /api/v1/queues/NAME/ — `lakeshore queues show`."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet.models import DaemonState
from jobs.models import Invocation
from tests.support import builders
from tests.support.assertions import assert_error
from tests.support.shapes import DAEMON_KEYS, QUEUE_KEYS

pytestmark = pytest.mark.django_db


def test_it_shows_a_queue_and_its_member_daemons(operator):
    gpu = builders.provider(name="gpu-cloud")
    builders.queue(
        name="training-h100",
        kind="priority",
        provider="gpu-cloud",
        elasticity_spec={"kind": "fixed", "min": 2},
    )
    beat = timezone.now()
    member = builders.daemon(
        queues=["training-h100", "other"],
        state=DaemonState.BUSY,
        provider=gpu,
        instance_type="p4d.24xlarge",
        last_heartbeat_at=beat,
    )
    Invocation.objects.create(  # an older one it ran, and the one it runs now
        queue="training-h100",
        function="lakeshore.functions.echo",
        state="succeeded",
        daemon=member,
    )
    job = Invocation.objects.create(
        queue="training-h100",
        function="lakeshore.functions.echo",
        state="running",
        daemon=member,
    )

    response = operator.get("/api/v1/queues/training-h100/")

    assert response.status_code == 200
    body = response.json()
    assert set(body) == QUEUE_KEYS | {"daemons"}
    assert body["name"] == "training-h100"
    assert body["provider"] == "gpu-cloud"
    assert body["members"] == 1
    assert body["elasticity"] == {"kind": "fixed", "min": 2, "max": None, "threshold": None}
    [daemon] = body["daemons"]
    assert set(daemon) == DAEMON_KEYS
    assert daemon["id"] == str(member.pk)
    assert daemon["name"] == member.name
    assert daemon["queues"] == ["training-h100", "other"]
    assert daemon["state"] == "busy"
    assert daemon["provider"] == "gpu-cloud"
    assert daemon["instance_type"] == "p4d.24xlarge"
    assert daemon["current_invocation"] == str(job.pk)
    assert daemon["last_heartbeat_at"].endswith("Z")
    assert daemon["created_at"].endswith("Z")


def test_it_shows_only_live_members(operator):
    builders.queue(name="q")
    idle = builders.daemon(queues=["q"])
    draining = builders.daemon(queues=["q"], state=DaemonState.DRAINING)
    builders.daemon(queues=["q"], state=DaemonState.TERMINATED)
    builders.daemon(queues=["q"], state=DaemonState.LOST)
    builders.daemon(queues=["elsewhere"])

    body = operator.get("/api/v1/queues/q/").json()

    assert sorted(d["id"] for d in body["daemons"]) == sorted([str(idle.pk), str(draining.pk)])
    assert body["members"] == 2


def test_a_daemon_without_work_shows_nulls(operator):
    builders.queue(name="q")
    builders.daemon(queues=["q"])

    [daemon] = operator.get("/api/v1/queues/q/").json()["daemons"]

    assert daemon["provider"] is None
    assert daemon["current_invocation"] is None
    assert daemon["last_heartbeat_at"] is None


def test_it_shows_an_archived_queue(operator):
    builders.queue(name="old")
    operator.post("/api/v1/queues/old/archive/")

    response = operator.get("/api/v1/queues/old/")

    assert response.status_code == 200
    assert response.json()["state"] == "archived"


def test_it_answers_404_for_an_unknown_queue(operator):
    response = operator.get("/api/v1/queues/nope/")

    assert_error(response, 404, "not_found", says="nope")


def test_it_runs_the_same_number_of_queries_for_1_and_50_members(operator):
    provider = builders.provider()
    builders.queue(name="q", provider=provider.name)
    builders.daemon(queues=["q"], provider=provider)
    operator.get("/api/v1/queues/q/")  # the first request of a token also stamps its last use

    with CaptureQueriesContext(connection) as one:
        assert len(operator.get("/api/v1/queues/q/").json()["daemons"]) == 1
    for _ in range(49):
        member = builders.daemon(queues=["q"], provider=provider, state=DaemonState.BUSY)
        Invocation.objects.create(
            queue="q", function="lakeshore.functions.echo", state="running", daemon=member
        )
    with CaptureQueriesContext(connection) as fifty:
        body = operator.get("/api/v1/queues/q/").json()

    assert len(body["daemons"]) == 50
    assert body["members"] == 50
    assert len(fifty) == len(one)
