"""A kill that races a finishing job (issue 31, "Killed or finished: say which"). An
operator stops a running job on its daemon, but the job had finished its work before the
order reached the daemon, which then reports the outcome: the report is refused and the
job stays killed, and the outcome it brought is kept as discarded, with when it came.
Once, and only from the daemon and attempt the killed claim belonged to. The job's page
and the API's job detail say what happened. A real daemon's side of it is in
tests/daemon/test_killed_or_finished.py."""

import re

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from accounts.roles import grant
from fleet import orders, protocol
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from lakeshore_admin.errors import Conflict
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

QUEUE = "train"


def _daemon_client(name: str) -> tuple[Daemon, APIClient]:
    """A daemon registered through the API, and a client holding its own credential."""
    client = APIClient(SERVER_NAME="localhost")
    client.credentials(**builders.auth(builders.token("daemon", username=f"robot-{name}")))
    answer = builders.register(client, {"name": name, "queues": [QUEUE]}).json()
    return Daemon.objects.get(pk=answer["id"]), client


@pytest.fixture
def stopped():
    """A job that daemon w1 claimed and an operator (op) then stopped there: (daemon, its
    client, the job)."""
    builders.queue(name=QUEUE)
    daemon, robot = _daemon_client("w1")
    inv, _ = services.invocation_submit(function="lakeshore.functions.echo", queue=QUEUE)
    claimed = robot.post(f"/api/v1/daemons/{daemon.pk}/claim/", {"limit": 1}, format="json")
    assert [c["id"] for c in claimed.json()] == [str(inv.pk)]
    operator = APIClient(SERVER_NAME="localhost")
    operator.credentials(**builders.auth(builders.token("operator", username="op")))
    killed = operator.post(
        f"/api/v1/daemons/{daemon.pk}/exec/", {"verb": "kill", "job": inv.pk}, format="json"
    )
    assert killed.status_code == 201, killed.json()
    return daemon, robot, Invocation.objects.get(pk=inv.pk)


def _report(robot, daemon, inv, state="succeeded", attempt=1):
    body = {"invocation": inv.pk, "attempt": attempt, "state": state, "result": {"n": 1}}
    if state != "succeeded":
        body["error"] = "Traceback ...\nValueError: boom"
    return robot.post(f"/api/v1/daemons/{daemon.pk}/complete/", body, format="json")


def _row(inv) -> dict:
    return Invocation.objects.filter(pk=inv.pk).values().get()


def _words(page: str) -> str:
    """A page's text, tags gone and spaces collapsed, as a reader sees it."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page))


# ---------------------------------------------------------------------------- the transition


def test_it_refuses_a_report_after_the_kill_and_keeps_the_outcome_it_brought(stopped):
    daemon, robot, inv = stopped
    reason = f"stopped on daemon {daemon.pk} by op (daemon exec kill)"

    error = assert_error(
        _report(robot, daemon, inv),
        409,
        "claim_stale",
        says=[f"Invocation {inv.pk} was killed", "the outcome succeeded was not recorded"],
    )

    assert (error["state"], error["reason"]) == ("killed", reason)
    row = _row(inv)
    assert (row["state"], row["reason"], row["result"], row["error"]) == (
        "killed",
        reason,
        None,
        "",
    )
    assert row["finished_at"] == inv.finished_at  # the kill's moment stands
    assert row["discarded_outcome"] == "succeeded"
    assert row["discarded_at"] >= row["finished_at"]


def test_a_retried_report_moves_nothing(stopped):
    daemon, robot, inv = stopped
    assert _report(robot, daemon, inv).status_code == 409
    kept = _row(inv)

    again = _report(robot, daemon, inv)  # its answer was lost: the daemon sends it again
    other = _report(robot, daemon, inv, state="failed")

    for response in (again, other):
        error = assert_error(response, 409, "claim_stale", says="was killed")
        assert error["state"] == "killed"
    assert _row(inv) == kept


def test_another_daemons_report_of_that_attempt_keeps_nothing(stopped):
    daemon, robot, inv = stopped
    other, other_robot = _daemon_client("w2")
    before = _row(inv)

    # with its own credential, for itself: the fence (daemon and attempt) refuses it
    error = assert_error(_report(other_robot, other, inv), 409, "claim_stale", says="not yours")
    assert "state" not in error and "reason" not in error  # nothing said of another's job
    # with its credential, for the daemon that ran it: refused before the body is read
    assert_error(_report(other_robot, daemon, inv), 403, "not_your_daemon")

    assert _row(inv) == before


def test_a_report_of_another_attempt_keeps_nothing(stopped):
    daemon, robot, inv = stopped
    before = _row(inv)

    assert_error(_report(robot, daemon, inv, attempt=2), 409, "claim_stale", says="not yours")

    assert _row(inv) == before


def test_a_recorded_failure_killed_in_the_queue_is_not_taken_for_a_discarded_one():
    """A failure with an attempt left goes back to the queue keeping its daemon and
    attempt; killed there, a retry of that report (recorded already) keeps nothing."""
    builders.queue(name=QUEUE)
    daemon, robot = _daemon_client("w1")
    inv, _ = services.invocation_submit(function="x.y", queue=QUEUE, max_attempts=2)
    robot.post(f"/api/v1/daemons/{daemon.pk}/claim/", {"limit": 1}, format="json")
    assert _report(robot, daemon, inv, state="failed").status_code == 200
    services.invocation_kill(invocation_id=inv.pk)
    before = _row(inv)
    assert (before["state"], before["daemon_id"], before["attempts"]) == ("killed", daemon.pk, 1)

    assert _report(robot, daemon, inv, state="failed").status_code == 409

    assert _row(inv) == before
    assert before["discarded_outcome"] == ""


def test_negative_control_a_kill_that_reaches_the_job_first_keeps_nothing(stopped):
    """The daemon stopped the job before it ended: it reports nothing."""
    daemon, robot, inv = stopped
    row = _row(inv)
    assert (row["state"], row["discarded_outcome"], row["discarded_at"]) == ("killed", "", None)
    assert Invocation.objects.get(pk=inv.pk).finished_before_kill is False


def test_a_kill_after_the_outcome_was_recorded_is_refused_and_the_outcome_stands():
    builders.queue(name=QUEUE)
    daemon, robot = _daemon_client("w1")
    inv, _ = services.invocation_submit(function="x.y", queue=QUEUE)
    robot.post(f"/api/v1/daemons/{daemon.pk}/claim/", {"limit": 1}, format="json")
    assert _report(robot, daemon, inv).status_code == 200
    before = _row(inv)

    with pytest.raises(Conflict) as refused:
        orders.daemon_exec(daemon=daemon, verb="kill", invocation_id=inv.pk)

    assert refused.value.code == "invocation_not_running"
    assert refused.value.message == (
        f"Invocation {inv.pk} is not running (succeeded): nothing to stop; it ended before "
        "the kill came and keeps its outcome."
    )
    assert _row(inv) == before
    assert (before["state"], before["result"], before["discarded_outcome"]) == (
        "succeeded",
        {"n": 1},
        "",
    )


def test_a_batch_refuses_the_killed_outcome_alone_and_keeps_it():
    builders.queue(name=QUEUE)
    daemon = builders.daemon(queues=[QUEUE])
    first, _ = services.invocation_submit(function="x.y", queue=QUEUE)
    second, _ = services.invocation_submit(function="x.y", queue=QUEUE)
    assert len(builders.claim(daemon=daemon, limit=2)) == 2
    orders.daemon_exec(daemon=daemon, verb="kill", invocation_id=second.pk)
    outcomes = [
        {"invocation": inv.pk, "attempt": 1, "state": "succeeded", "result": inv.pk}
        for inv in (first, second)
    ]

    answers = protocol.invocation_complete_batch(daemon=daemon, outcomes=outcomes)

    assert answers[0] == {"invocation": str(first.pk), "ok": True, "state": "succeeded"}
    assert answers[1]["ok"] is False
    error = answers[1]["error"]
    assert (error["code"], error["state"]) == ("claim_stale", "killed")
    assert error["reason"].startswith(f"stopped on daemon {daemon.pk} by ")
    assert _row(second)["discarded_outcome"] == "succeeded"
    assert _row(first)["discarded_outcome"] == ""


# ---------------------------------------------------------------------------- what it shows


def test_the_api_job_detail_says_which_outcome_was_discarded_and_when(stopped):
    daemon, robot, inv = stopped
    viewer = APIClient(SERVER_NAME="localhost")
    viewer.credentials(**builders.auth(builders.token("viewer")))
    before = viewer.get(f"/api/v1/jobs/{inv.pk}/").json()
    assert (before["discarded_outcome"], before["discarded_at"]) == (None, None)

    _report(robot, daemon, inv)
    job = viewer.get(f"/api/v1/jobs/{inv.pk}/").json()

    row = Invocation.objects.get(pk=inv.pk)
    assert job["state"] == "killed"
    assert job["discarded_outcome"] == "succeeded"
    assert job["discarded_at"] == row.discarded_at.isoformat().replace("+00:00", "Z")


def _page(client, inv) -> str:
    user = get_user_model().objects.create_user("reader", password="pw-x-12345")
    grant(user, "viewer")
    client.force_login(user)
    return client.get(f"/jobs/{inv.pk}/").content.decode()


def test_the_job_page_says_it_was_killed_after_it_finished_its_work(stopped, client):
    daemon, robot, inv = stopped
    _report(robot, daemon, inv)
    row = Invocation.objects.get(pk=inv.pk)
    at = "%Y-%m-%d %H:%M:%S"

    text = _words(_page(client, inv))

    assert (
        f"Killed at {row.finished_at.strftime(at)}: stopped on daemon {daemon.pk} by op "
        "(daemon exec kill). The job had already finished its work before the kill reached "
        f"it: its daemon reported succeeded at {row.discarded_at.strftime(at)}, and that "
        "outcome was discarded (a killed job stays killed)."
    ) in text
    assert "None kept: the job's outcome (succeeded) came after the kill and was discarded." in (
        text
    )
    # the timeline shows both moments, the kill first
    killed = text.index(f"ended killed: stopped on daemon {daemon.pk} by op")
    reported = text.index(
        f"daemon {daemon.pk} reported attempt 1 succeeded: the job had finished its work "
        "before the kill reached it; that outcome was discarded"
    )
    assert killed < reported


def test_negative_control_the_page_of_a_job_killed_before_it_finished_says_only_killed(
    stopped, client
):
    daemon, robot, inv = stopped
    page = _page(client, inv)
    assert 'id="job-finished-before-kill"' not in page
    assert "finished its work" not in page and "discarded" not in page
    assert f"ended killed: stopped on daemon {daemon.pk} by op" in _words(page)
