"""A kill that races a finishing job, against a real `lakeshore daemon run` (issue 31,
"Killed or finished: say which"). The operator's kill is forced to land between the
job's end and the daemon's report of it: a hook holds the report on the server until
the kill (`lakeshore daemon exec`, a request of its own) has committed. The job's page,
the API and `lakeshore jobs show` then say that the job had finished its work before the
kill reached it, and which outcome was discarded; the daemon's log says which outcome
was not recorded, and why. The negative control: a kill that reaches the job while it
runs keeps nothing."""

import re

import pytest
from django.contrib.auth import get_user_model

from accounts.roles import grant
from fleet.models import Daemon, DaemonCommand
from jobs import services
from jobs.models import Invocation
from lakeshore.output import when
from lakeshore_admin import hooks
from tests.daemon.jobfuncs import starts
from tests.daemon.test_daemon_faults import FUNCS, _log, _stop, _wait_for
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LAST_WORDS = "job 64: done"


@pytest.fixture(autouse=True)
def _no_hooks_left():
    yield
    hooks.clear()


def _page_words(client, inv) -> str:
    """The job's page as a viewer reads it: tags gone, spaces collapsed."""
    user = get_user_model().objects.create_user("reader", password="pw-x-12345")
    grant(user, "viewer")
    client.force_login(user)
    page = client.get(f"/jobs/{inv.pk}/").content.decode()
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page))


@pytest.mark.parametrize("isolation", ["pool"])  # the race is on the server's side: once
def test_a_kill_between_the_jobs_end_and_its_report_is_shown_as_it_happened(
    daemons, sh, client, tmp_path
):
    builders.queue(name="e2e")
    proc = daemons("d")
    _wait_for(Daemon.objects.exists, what="the daemon's registration")
    daemon = Daemon.objects.get()
    kills, errors = [], []

    def kill_before_the_report_is_looked_at():
        """In the server's request carrying the job's outcome, before its statement."""
        if kills:
            return
        job = Invocation.objects.get()
        kills.append(job.state)  # still running: the job ended, the server knows nothing
        try:
            sh(f"lakeshore daemon exec {daemon.pk} kill {job.pk}")
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
            errors.append(exc)

    hooks.register("complete.before_statement", kill_before_the_report_is_looked_at)
    inv, _ = services.invocation_submit(
        function=f"{FUNCS}.says_done", queue="e2e", args=[LAST_WORDS]
    )
    _wait_for(
        lambda: Invocation.objects.get(pk=inv.pk).discarded_outcome, what="the discarded report"
    )
    assert errors == [] and kills == ["running"]
    # The order reaches the daemon with a heartbeat, which an idle daemon leaves to its
    # claims: with the next job running, it comes, and the job it names had ended.
    ledger = str(tmp_path / "ledger")
    services.invocation_submit(function=f"{FUNCS}.ledger_sleep", queue="e2e", args=[ledger, 5])
    _wait_for(lambda: DaemonCommand.objects.get().done_at is not None, what="the daemon's word")
    assert DaemonCommand.objects.get().result == "it no longer ran here"

    row = Invocation.objects.get(pk=inv.pk)
    reason = f"stopped on daemon {daemon.pk} by alice (daemon exec kill)"
    assert (row.state, row.reason, row.result) == ("killed", reason, None)
    assert row.discarded_outcome == "succeeded"
    assert row.finished_at <= row.discarded_at

    # the daemon's log: which outcome was not recorded, and why
    said = (
        f"invocation {inv.pk}: outcome succeeded not recorded (killed on the server before "
        f"this report came: {reason})"
    )
    _wait_for(lambda: said in _log(tmp_path, "d"), what="the daemon's log line")

    # the page: killed, yet it had finished its work (its output says so too)
    at = "%Y-%m-%d %H:%M:%S"
    words = _page_words(client, inv)
    assert (
        f"Killed at {row.finished_at.strftime(at)}: {reason}. The job had already finished "
        "its work before the kill reached it: its daemon reported succeeded at "
        f"{row.discarded_at.strftime(at)}, and that outcome was discarded (a killed job "
        "stays killed)."
    ) in words
    assert LAST_WORDS in words
    assert words.index(f"ended killed: {reason}") < words.index(
        f"daemon {daemon.pk} reported attempt 1 succeeded: the job had finished its work"
    )

    # the API's job detail (what --json prints) and `jobs show`
    shown = sh.json(f"lakeshore jobs show {inv.pk} --json")
    assert (shown["state"], shown["discarded_outcome"]) == ("killed", "succeeded")
    assert shown["discarded_at"] == row.discarded_at.isoformat().replace("+00:00", "Z")
    text = sh(f"lakeshore jobs show {inv.pk}").stdout
    assert (
        "Note:\n"
        f"  Killed at {when(shown['finished_at'])}: {reason}. The job had already finished "
        "its work before the kill reached it: its daemon reported succeeded at "
        f"{when(shown['discarded_at'])}, and that outcome was discarded (a killed job stays "
        "killed).\n"
    ) in text
    assert _stop(proc, "d") == 0, _log(tmp_path, "d")


@pytest.mark.parametrize("isolation", ["pool"])
def test_negative_control_a_kill_that_reaches_the_job_while_it_runs_keeps_nothing(
    daemons, sh, client, tmp_path
):
    builders.queue(name="e2e")
    ledger = str(tmp_path / "ledger")
    proc = daemons("d")
    inv, _ = services.invocation_submit(
        function=f"{FUNCS}.ledger_sleep", queue="e2e", args=[ledger, 120]
    )
    _wait_for(lambda: starts(ledger), what="the job to start")
    daemon = Daemon.objects.get()

    sh(f"lakeshore daemon exec {daemon.pk} kill {inv.pk}")
    _wait_for(lambda: DaemonCommand.objects.get().done_at is not None, what="the daemon's word")
    assert DaemonCommand.objects.get().result == "SIGKILL sent to its process group"
    # the daemon reports in order: once a later job's end is recorded, nothing of the
    # killed one is on its way
    later, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="e2e")
    _wait_for(lambda: Invocation.objects.get(pk=later.pk).state == "succeeded", what="later")

    row = Invocation.objects.get(pk=inv.pk)
    assert (row.state, row.discarded_outcome, row.discarded_at) == ("killed", "", None)
    assert "not recorded" not in _log(tmp_path, "d")
    words = _page_words(client, inv)
    assert "finished its work" not in words and "discarded" not in words
    shown = sh.json(f"lakeshore jobs show {inv.pk} --json")
    assert (shown["state"], shown["discarded_outcome"], shown["discarded_at"]) == (
        "killed",
        None,
        None,
    )
    assert "Note:" not in sh(f"lakeshore jobs show {inv.pk}").stdout
    assert _stop(proc, "d") == 0, _log(tmp_path, "d")
