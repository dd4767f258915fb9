"""DELETE /api/v1/queues/NAME/ — `lakeshore queues rm [--force]`."""

import pytest

from fleet.models import Daemon, DaemonState
from jobs.models import Invocation
from queues.models import Queue
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db


def rm(client, name: str = "eval", force: bool = False):
    return client.delete(f"/api/v1/queues/{name}/" + ("?force=true" if force else ""))


def job(queue: str = "eval", state: str = "queued") -> Invocation:
    return Invocation.objects.create(queue=queue, function="lakeshore.functions.echo", state=state)


def test_it_removes_a_queue(operator):
    builders.queue(name="eval")

    response = rm(operator)

    assert response.status_code == 200
    assert response.json()["name"] == "eval"
    assert response.json()["deleted"] is True
    assert not Queue.objects.filter(name="eval").exists()
    assert_error(operator.get("/api/v1/queues/eval/"), 404, "not_found")
    assert_error(rm(operator), 404, "not_found", says="eval")


def test_it_refuses_while_a_live_daemon_is_bound_and_names_it(operator):
    builders.queue(name="eval")
    bound = builders.daemon(queues=["eval", "other"], name="gpu-worker-7")

    response = rm(operator)

    error = assert_error(response, 409, "queue_in_use", says=["gpu-worker-7", "--force"])
    assert str(bound.pk) in error["message"]
    assert Queue.objects.filter(name="eval").exists()
    assert Daemon.objects.get(pk=bound.pk).queues == ["eval", "other"]


@pytest.mark.parametrize("state", ["provisioning", "idle", "busy", "draining"])
def test_every_live_state_blocks_removal(operator, state):
    builders.queue(name="eval")
    builders.daemon(queues=["eval"], state=state)

    assert rm(operator).status_code == 409


@pytest.mark.parametrize("state", [DaemonState.TERMINATED, DaemonState.LOST])
def test_dead_daemons_do_not_block_removal(operator, state):
    builders.queue(name="eval")
    dead = builders.daemon(queues=["eval"], state=state)

    response = rm(operator)

    assert response.status_code == 200
    assert not Queue.objects.filter(name="eval").exists()
    assert Daemon.objects.get(pk=dead.pk).state == state


def test_force_unbinds_every_daemon(operator):
    builders.queue(name="eval")
    builders.queue(name="train")
    both = builders.daemon(queues=["train", "eval"])
    only = builders.daemon(queues=["eval"])
    busy_only = builders.daemon(queues=["eval"], state=DaemonState.BUSY)
    other = builders.daemon(queues=["train"])
    dead = builders.daemon(queues=["eval"], state=DaemonState.TERMINATED)

    response = rm(operator, force=True)

    assert response.status_code == 200
    assert response.json()["unbound_daemons"] == 4
    assert not Queue.objects.filter(name="eval").exists()
    fresh = {d.pk: d for d in Daemon.objects.all()}
    assert fresh[both.pk].queues == ["train"]
    assert fresh[both.pk].state == DaemonState.IDLE
    assert fresh[other.pk].queues == ["train"]
    assert fresh[dead.pk].queues == []
    assert fresh[dead.pk].state == DaemonState.TERMINATED
    # With no queue left they would start serving the default queue: they drain instead.
    for orphan in (only, busy_only):
        assert fresh[orphan.pk].queues == []
        assert fresh[orphan.pk].state == DaemonState.DRAINING
    assert operator.get("/api/v1/queues/train/").json()["members"] == 2


def test_queued_invocations_block_removal(operator):
    builders.queue(name="eval")
    waiting = job()

    response = rm(operator)

    assert_error(response, 409, "queue_in_use", says=["queued", "bulk-cancel", "--force"])
    assert Queue.objects.filter(name="eval").exists()
    waiting.refresh_from_db()
    assert waiting.state == "queued"


def test_force_kills_queued_invocations_and_keeps_history(operator):
    builders.queue(name="eval")
    waiting = [job(), job()]
    done = job(state="succeeded")
    elsewhere = job(queue="train")

    response = rm(operator, force=True)

    assert response.status_code == 200
    assert response.json()["killed"] == 2
    for invocation in waiting:
        invocation.refresh_from_db()
        assert invocation.state == "killed"
        assert invocation.reason == "queue removed"
        assert invocation.finished_at is not None
    done.refresh_from_db()
    elsewhere.refresh_from_db()
    assert (done.state, done.queue) == ("succeeded", "eval")
    assert elsewhere.state == "queued"


@pytest.mark.parametrize("force", [False, True])
def test_a_running_invocation_blocks_removal_even_with_force(operator, force):
    builders.queue(name="eval")
    builders.daemon(queues=["eval"], state=DaemonState.BUSY)
    running = job(state="running")
    waiting = job()

    response = rm(operator, force=force)

    assert_error(response, 409, "queue_in_use", says=["running", "drain"])
    assert Queue.objects.filter(name="eval").exists()
    running.refresh_from_db()
    waiting.refresh_from_db()
    assert (running.state, waiting.state) == ("running", "queued")
    assert Daemon.objects.get().queues == ["eval"]


def test_removing_an_archived_queue_works(operator):
    builders.queue(name="eval")
    operator.post("/api/v1/queues/eval/archive/")

    assert rm(operator).status_code == 200
    assert not Queue.objects.exists()
