"""POST /api/v1/daemons/ID/exec/ — an operator stops one running invocation on its
daemon; the order rides the daemon's next heartbeat, once; only fixed verbs exist."""

import pytest
from rest_framework.test import APIClient

from accounts.models import AuditEvent
from fleet import daemons, protocol
from fleet.models import Daemon, DaemonCommand
from jobs import services
from jobs.models import Invocation
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db


def exec_url(daemon) -> str:
    return f"/api/v1/daemons/{daemon.pk}/exec/"


@pytest.fixture
def running():
    """A daemon (owned by `robot`) running one invocation, and the daemon's client."""
    builders.queue(name="train")
    robot = APIClient()
    robot.credentials(**builders.auth(builders.token("daemon", username="robot")))
    answer = builders.register(robot, {"name": "w1", "queues": ["train"]}).json()
    daemon = Daemon.objects.get(pk=answer["id"])
    inv, _ = services.invocation_submit(function="lakeshore.functions.sleep", queue="train")
    claimed = robot.post(f"/api/v1/daemons/{daemon.pk}/claim/", {"limit": 1}, format="json")
    assert [c["id"] for c in claimed.json()] == [str(inv.pk)]
    return daemon, inv, robot


def test_an_operator_kills_it_the_job_ends_killed_with_who_asked(running):
    daemon, inv, robot = running
    operator = APIClient()
    operator.credentials(**builders.auth(builders.token("operator", username="op")))
    response = operator.post(exec_url(daemon), {"verb": "kill", "job": inv.pk}, format="json")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["verb"], body["signal"], body["state"]) == ("kill", "KILL", "killed")
    inv.refresh_from_db()
    assert inv.state == "killed" and inv.finished_at is not None
    assert inv.reason == f"stopped on daemon {daemon.pk} by op (daemon exec kill)"
    audit = AuditEvent.objects.get(action="daemon.exec")
    assert (audit.actor, audit.target, audit.queue) == ("op", f"job {inv.pk}", "train")

    # the next heartbeat carries the order, once; the job is no longer the daemon's
    beat = robot.post(f"/api/v1/daemons/{daemon.pk}/heartbeat/", {}, format="json").json()
    assert beat["running"] == []
    assert [(c["verb"], c["signal"], c["invocation"]) for c in beat["commands"]] == [
        ("kill", "KILL", str(inv.pk))
    ]
    again = robot.post(f"/api/v1/daemons/{daemon.pk}/heartbeat/", {}, format="json").json()
    assert again["commands"] == []

    # the daemon says what it did; saying it twice keeps the first word
    done_url = f"/api/v1/daemons/{daemon.pk}/commands/{beat['commands'][0]['id']}/done/"
    first = robot.post(done_url, {"result": "SIGKILL sent"}, format="json")
    second = robot.post(done_url, {"result": "something else"}, format="json")
    assert first.status_code == second.status_code == 200
    assert DaemonCommand.objects.get().result == "SIGKILL sent"


def test_signal_needs_one_of_term_int_kill(operator, running):
    daemon, inv, _ = running
    missing = operator.post(exec_url(daemon), {"verb": "signal", "job": inv.pk}, format="json")
    wrong = operator.post(
        exec_url(daemon), {"verb": "signal", "job": inv.pk, "signal": "HUP"}, format="json"
    )
    kill_term = operator.post(
        exec_url(daemon), {"verb": "kill", "job": inv.pk, "signal": "TERM"}, format="json"
    )
    verb = operator.post(exec_url(daemon), {"verb": "rm -rf", "job": inv.pk}, format="json")
    shell = operator.post(
        exec_url(daemon), {"verb": "kill", "job": inv.pk, "command": "id"}, format="json"
    )

    assert_error(missing, 400, "invalid", field="signal", says="required")
    assert_error(wrong, 400, "invalid", field="signal")
    assert_error(kill_term, 400, "invalid", field="signal", says="kill always sends KILL")
    assert_error(verb, 400, "invalid", field="verb")
    assert_error(shell, 400, "invalid", field="command")
    assert Invocation.objects.get(pk=inv.pk).state == "running"  # nothing happened
    assert not DaemonCommand.objects.exists()

    ok = operator.post(
        exec_url(daemon), {"verb": "signal", "job": inv.pk, "signal": "TERM"}, format="json"
    )
    assert ok.status_code == 201 and ok.json()["signal"] == "TERM"


def test_only_operators_may(viewer, running):
    daemon, inv, robot = running
    as_viewer = viewer.post(exec_url(daemon), {"verb": "kill", "job": inv.pk}, format="json")
    as_daemon = robot.post(exec_url(daemon), {"verb": "kill", "job": inv.pk}, format="json")

    assert_error(as_viewer, 403, "permission_denied")
    assert_error(as_daemon, 403, "permission_denied")
    assert Invocation.objects.get(pk=inv.pk).state == "running"


def test_a_job_that_is_not_running_there_says_where_it_is(operator, running):
    daemon, inv, _ = running
    other = builders.daemon(queues=["train"])
    queued, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="train")

    elsewhere = operator.post(exec_url(other), {"verb": "kill", "job": inv.pk}, format="json")
    waiting = operator.post(exec_url(daemon), {"verb": "kill", "job": queued.pk}, format="json")
    missing = operator.post(exec_url(daemon), {"verb": "kill", "job": 999999}, format="json")

    assert_error(
        elsewhere,
        409,
        "invocation_elsewhere",
        says=f"lakeshore daemon exec {daemon.pk} kill {inv.pk}",
    )
    assert_error(waiting, 409, "invocation_not_running", says=f"lakeshore jobs kill {queued.pk}")
    assert_error(missing, 404, "not_found")
    assert Invocation.objects.get(pk=inv.pk).state == "running"
    assert not DaemonCommand.objects.exists()
    assert not AuditEvent.objects.filter(action="daemon.exec").exists()


def test_a_finished_job_or_an_ended_daemon_is_refused(operator, running):
    daemon, inv, _ = running
    protocol.invocation_complete(daemon=daemon, invocation_id=inv.pk, attempt=1)
    finished = operator.post(exec_url(daemon), {"verb": "kill", "job": inv.pk}, format="json")
    assert_error(finished, 409, "invocation_not_running", says="succeeded")

    daemons.daemon_drop(daemon=daemon)
    gone = operator.post(exec_url(daemon), {"verb": "kill", "job": inv.pk}, format="json")
    assert_error(gone, 409, "daemon_terminated")
    assert Invocation.objects.get(pk=inv.pk).state == "succeeded"


def test_jobs_kill_of_a_running_job_points_to_daemon_exec(operator, running):
    daemon, inv, _ = running
    response = operator.post(f"/api/v1/jobs/{inv.pk}/kill/", {}, format="json")

    assert_error(
        response,
        409,
        "invocation_running",
        says=f"lakeshore daemon exec {daemon.pk} kill {inv.pk}",
    )


def test_a_daemon_reports_only_its_own_commands(operator, running):
    daemon, inv, robot = running
    operator.post(exec_url(daemon), {"verb": "kill", "job": inv.pk}, format="json")
    command = DaemonCommand.objects.get()
    other = APIClient()
    other.credentials(**builders.auth(builders.token("daemon", username="intruder")))

    refused = other.post(
        f"/api/v1/daemons/{daemon.pk}/commands/{command.pk}/done/", {"result": "x"}, format="json"
    )
    unknown = robot.post(
        f"/api/v1/daemons/{daemon.pk}/commands/999/done/", {"result": "x"}, format="json"
    )

    assert_error(refused, 403, "not_your_daemon")
    assert_error(unknown, 404, "not_found")
    assert DaemonCommand.objects.get().done_at is None
