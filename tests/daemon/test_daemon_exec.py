"""`lakeshore daemon exec DAEMON kill JOB` (and `… signal JOB TERM|INT|KILL`) against a
real daemon: the job's process stops within seconds, the job ends killed with who asked,
no process is left, and the daemon carries on."""

import os
import subprocess
import time

import pytest

from fleet.models import Daemon, DaemonCommand
from jobs import services
from jobs.models import Invocation
from tests.daemon.jobfuncs import alive, starts
from tests.daemon.test_daemon_faults import FUNCS, LAKESHORE, _stop, _wait_for
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _exec(live_server, tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "LAKESHORE_URL": live_server.url,
        "LAKESHORE_TOKEN": builders.token("operator", username="alice"),
        "XDG_CONFIG_HOME": str(tmp_path),
    }
    return subprocess.run(
        [LAKESHORE, "daemon", "exec", *args], env=env, capture_output=True, text=True, timeout=30
    )


def _running_job(daemons, tmp_path, function: str, seconds: float):
    builders.queue(name="e2e")
    ledger = str(tmp_path / "ledger")
    proc = daemons("d")
    inv, _ = services.invocation_submit(
        function=f"{FUNCS}.{function}", queue="e2e", args=[ledger, seconds]
    )
    _wait_for(lambda: starts(ledger), what="the job to start")
    daemon = Daemon.objects.get()
    return proc, daemon, inv, starts(ledger)[0]["pid"]


def test_kill_stops_the_jobs_process_within_seconds_and_the_job_ends_killed(
    daemons, live_server, tmp_path
):
    proc, daemon, inv, pid = _running_job(daemons, tmp_path, "ledger_sleep", 120)
    asked = time.monotonic()
    out = _exec(live_server, tmp_path, str(daemon.pk), "kill", str(inv.pk))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        f"job/{inv.pk} killed on daemon {daemon.pk} (kill: SIGKILL); the daemon stops its "
        "processes at its next heartbeat"
    )
    inv.refresh_from_db()
    assert inv.state == "killed"
    assert inv.reason == f"stopped on daemon {daemon.pk} by alice (daemon exec kill)"

    # within seconds (the command's own process, then the daemon's next heartbeat: 1 s),
    # where the job would run on for its 120 s
    _wait_for(lambda: not alive(pid), timeout=30, what="the job's process to stop", every=0.05)
    took = time.monotonic() - asked
    assert took < 30, took
    command = DaemonCommand.objects.get()
    _wait_for(lambda: DaemonCommand.objects.get().done_at is not None, what="the daemon's report")
    command.refresh_from_db()
    assert command.result == "SIGKILL sent to its process group"
    assert command.requested_by == "alice (cli)"

    # the daemon carries on: the next job runs, and the killed one was never reported
    nxt, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="e2e")
    _wait_for(lambda: Invocation.objects.get(pk=nxt.pk).state == "succeeded", what="next job")
    assert Invocation.objects.get(pk=inv.pk).state == "killed"
    log = (tmp_path / "d.log").read_text()
    assert f"invocation {inv.pk}: stopped by alice (cli) (daemon exec kill KILL)" in log
    assert _stop(proc, "d") == 0
    assert not alive(pid)
    # its last line counts the killed one with the rest
    assert (
        "stopped (1 succeeded, 0 failed, 0 timeout, 1 killed)" in (tmp_path / "d.log").read_text()
    )


@pytest.mark.parametrize("isolation", ["pool"])  # the grace is the daemon's: once is enough
def test_signal_term_that_the_job_ignores_is_followed_by_kill_after_the_grace(
    daemons, live_server, tmp_path
):
    proc, daemon, inv, pid = _running_job(daemons, tmp_path, "ignores_term", 120)
    out = _exec(live_server, tmp_path, str(daemon.pk), "signal", str(inv.pk), "TERM")
    assert out.returncode == 0, out.stderr
    _wait_for(lambda: DaemonCommand.objects.get().delivered_at is not None, what="the delivery")
    time.sleep(3)
    assert alive(pid)  # TERM ignored: still in its grace
    _wait_for(lambda: not alive(pid), timeout=30, what="KILL after the grace", every=0.1)
    _wait_for(lambda: DaemonCommand.objects.get().done_at is not None, what="the report")
    assert DaemonCommand.objects.get().result == ("SIGTERM sent; still running after 10 s: SIGKILL")
    assert Invocation.objects.get(pk=inv.pk).state == "killed"
    assert _stop(proc, "d") == 0


def test_signal_term_stops_a_job_that_obeys_it(daemons, live_server, tmp_path):
    proc, daemon, inv, pid = _running_job(daemons, tmp_path, "ledger_sleep", 120)
    out = _exec(live_server, tmp_path, str(daemon.pk), "signal", str(inv.pk), "term")
    assert out.returncode == 0, out.stderr
    _wait_for(lambda: not alive(pid), timeout=30, what="the job's process to stop")
    _wait_for(lambda: DaemonCommand.objects.get().done_at is not None, what="the report")
    assert DaemonCommand.objects.get().result == "SIGTERM sent to its process group; it exited"
    assert _stop(proc, "d") == 0
