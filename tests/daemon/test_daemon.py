"""A real `lakeshore daemon run` process against the live server."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from accounts.authentication import token_cache
from accounts.models import ApiToken
from fleet import daemons
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from tests.daemon import jobfuncs
from tests.support import builders
from tests.support.servers import database_url
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LAKESHORE = str(Path(sys.executable).parent / "lakeshore")
ROOT = Path(__file__).resolve().parents[2]  # the repository: PYTHONPATH for tests.daemon


def _start_daemon(live_server, tmp_path, *args, **settings):
    env = {
        **os.environ,
        "LAKESHORE_URL": live_server.url,
        "LAKESHORE_TOKEN": builders.token("daemon"),
        "XDG_CONFIG_HOME": str(tmp_path),
        **settings,
    }
    log = open(tmp_path / "daemon.log", "w")  # noqa: SIM115 - closed by the caller's process end
    return subprocess.Popen(
        [LAKESHORE, "daemon", "run", "--heartbeat", "1", *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: kill -9 takes its children too
    )


def _log(tmp_path) -> str:
    return (tmp_path / "daemon.log").read_text()


def test_it_runs_echo_sleep_and_fail_to_their_final_states(live_server, tmp_path):
    builders.queue(name="e2e")
    echo, _ = services.invocation_submit(
        function="lakeshore.functions.echo", queue="e2e", args=["hi"], kwargs={"n": 1}
    )
    nap, _ = services.invocation_submit(
        function="lakeshore.functions.sleep", queue="e2e", args=[0.2]
    )
    boom, _ = services.invocation_submit(
        function="lakeshore.functions.fail", queue="e2e", args=["kaboom"]
    )
    forbidden, _ = services.invocation_submit(function="os.getcwd", queue="e2e")
    slow, _ = services.invocation_submit(
        function="lakeshore.functions.sleep", queue="e2e", args=[30], timeout_s=1
    )
    ids = [echo.pk, nap.pk, boom.pk, forbidden.pk, slow.pk]
    proc = _start_daemon(live_server, tmp_path, "--queues", "e2e", "--concurrency", "2")
    try:
        wait_for(
            lambda: not Invocation.objects.filter(pk__in=ids, state__in=["queued", "running"]),
            what="every invocation to finish",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, _log(tmp_path)
    got = {inv.pk: inv for inv in Invocation.objects.filter(pk__in=ids)}
    assert got[echo.pk].state == "succeeded"
    assert got[echo.pk].result == {"args": ["hi"], "kwargs": {"n": 1}}
    assert (got[nap.pk].state, got[nap.pk].result) == ("succeeded", 0.2)
    assert got[boom.pk].state == "failed"
    assert "RuntimeError: kaboom" in got[boom.pk].error and "Traceback" in got[boom.pk].error
    assert got[forbidden.pk].state == "failed"
    assert "LAKESHORE_ALLOWED_MODULES" in got[forbidden.pk].error
    assert got[slow.pk].state == "timeout"
    daemon = Daemon.objects.get()
    assert daemon.state == "terminated"  # it deregistered on SIGTERM
    assert "deregistered" in _log(tmp_path)


def test_sigterm_lets_the_running_invocation_finish(live_server, tmp_path):
    builders.queue(name="e2e")
    inv, _ = services.invocation_submit(
        function="lakeshore.functions.sleep", queue="e2e", args=[1.5]
    )
    later, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="e2e")
    proc = _start_daemon(live_server, tmp_path, "--queues", "e2e")
    wait_for(lambda: Invocation.objects.get(pk=inv.pk).state == "running", what="the claim")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, _log(tmp_path)
    inv.refresh_from_db()
    later.refresh_from_db()
    assert inv.state == "succeeded"
    assert later.state == "queued"  # no claims after SIGTERM


def test_kill_9_then_the_reaper_requeues_or_fails_as_attempts_allow(live_server, tmp_path):
    builders.queue(name="e2e")
    retry, _ = services.invocation_submit(
        function="lakeshore.functions.sleep", queue="e2e", args=[60], max_attempts=2
    )
    once, _ = services.invocation_submit(
        function="lakeshore.functions.sleep", queue="e2e", args=[60], max_attempts=1
    )
    proc = _start_daemon(live_server, tmp_path, "--queues", "e2e", "--concurrency", "2")
    wait_for(lambda: Invocation.objects.filter(state="running").count() == 2, what="both claims")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    report = daemons.reap(now=timezone.now() + timedelta(seconds=61))
    assert report["lost"] == 1
    retry.refresh_from_db()
    once.refresh_from_db()
    assert (retry.state, retry.attempts, retry.daemon_id) == ("queued", 1, None)
    assert once.state == "failed" and once.error == "daemon gone (lost: no heartbeat)"
    assert Daemon.objects.get().state == "lost"


def test_the_daemon_rides_out_an_unreachable_server(tmp_path):
    """With nothing listening it retries with back-off instead of crashing."""

    class Nowhere:
        url = "http://127.0.0.1:9"  # discard port: connection refused

    proc = _start_daemon(Nowhere, tmp_path, "--queues", "e2e")
    wait_for(lambda: "retrying in" in _log(tmp_path), what="its first retry")
    time.sleep(1)
    assert proc.poll() is None, _log(tmp_path)
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)


def test_daemon_remove_stops_the_daemon_and_kills_its_work(live_server, tmp_path):
    builders.queue(name="e2e")
    inv, _ = services.invocation_submit(
        function="lakeshore.functions.sleep", queue="e2e", args=[60]
    )
    proc = _start_daemon(live_server, tmp_path, "--queues", "e2e")
    wait_for(lambda: Invocation.objects.get(pk=inv.pk).state == "running", what="the claim")
    daemon = Daemon.objects.get()
    env = {
        **os.environ,
        "LAKESHORE_URL": live_server.url,
        "LAKESHORE_TOKEN": builders.token("operator"),
        "XDG_CONFIG_HOME": str(tmp_path),
    }
    out = subprocess.run(
        [LAKESHORE, "daemon", "remove", str(daemon.pk)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"daemon/{daemon.pk} removed; 1 running invocation(s) killed"
    assert proc.wait(15) == 0, _log(tmp_path)  # it noticed at its next heartbeat
    inv.refresh_from_db()
    assert inv.state == "killed"
    assert "was removed on the server" in _log(tmp_path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int, tmp_path):
    """A real web server process on the test database (runserver, no reloader)."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "lakeshore_admin.settings",
        "LAKESHORE_VAR_DIR": str(tmp_path / "var"),
    }
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def up():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return True
        except OSError:
            return False

    wait_for(up, what="the web server")
    return proc


def test_the_daemon_survives_a_server_restart(tmp_path):
    """Ours rides it out; the SDK's own worker, attached too, exits at the refused
    connection (README: what survives a restart) and is lost 30 s after its last poll."""
    builders.queue(name="e2e")
    ledger = tmp_path / "ledger"
    inv, _ = services.invocation_submit(
        function="tests.daemon.jobfuncs.ledger_sleep", queue="e2e", args=[str(ledger), 2]
    )
    port = _free_port()
    server = _serve(port, tmp_path)

    class Address:
        url = f"http://127.0.0.1:{port}"

    allowed = {"LAKESHORE_ALLOWED_MODULES": "tests.daemon.jobfuncs", "PYTHONPATH": str(ROOT)}
    proc = _start_daemon(Address, tmp_path, "--queues", "e2e", **allowed)
    sdk_worker = subprocess.Popen(
        [sys.executable, "-m", "dreamlake.lakeshore.daemon", "--url", Address.url]
        + ["--token", builders.token("daemon"), "--queue", "e2e"],
        env={**os.environ, "LAKESHORE_HOME": str(tmp_path / "sdk")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: Daemon.objects.filter(worker_id__isnull=False).exists(), what="a poll")
        # the daemon runs the job (its claim's answer reached it), not only its row says
        # so: a server stopped between the claim and its answer leaves the job to its lease
        wait_for(lambda: jobfuncs.starts(str(ledger)), what="the job running on the daemon")
        server.terminate()
        server.wait(10)
        time.sleep(3)  # the invocation finishes while the server is down
        server = _serve(port, tmp_path)
        wait_for(
            lambda: Invocation.objects.get(pk=inv.pk).state == "succeeded",
            what="the outcome reported after the restart",
        )
        wait_for(lambda: "reconnected to the server" in _log(tmp_path), what="its reconnect")
        log = _log(tmp_path)
        assert "retrying in" in log
        # its log says the server is back, once, after the retries (not only "retrying")
        reconnected = [line for line in log.splitlines() if "reconnected to the server" in line]
        assert len(reconnected) == 1, log
        assert log.rindex("retrying in") < log.index("reconnected to the server after ")
        assert proc.poll() is None
        # the SDK's worker did not ride it out: the reaper marks it lost, not ours
        assert sdk_worker.wait(15) != 0
        seen = Daemon.objects.get(worker_id__isnull=False).last_heartbeat_at
        daemons.reap(now=seen + timedelta(seconds=daemons.sdk_idle_silence() + 1))
        assert Daemon.objects.get(worker_id__isnull=False).state == "lost"
        assert Daemon.objects.get(worker_id__isnull=True).state in ("idle", "busy")
    finally:
        sdk_worker.kill()
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        server.terminate()
        server.wait(10)


def test_a_daemon_for_an_unknown_queue_stops_with_the_servers_reason(live_server, tmp_path):
    proc = _start_daemon(live_server, tmp_path, "--queues", "nope")
    assert proc.wait(15) == 1
    log = _log(tmp_path)
    assert "error: Unknown queue(s): nope" in log and "Traceback" not in log


def test_a_daemon_whose_token_is_revoked_stops_cleanly(live_server, tmp_path, settings):
    """A provider revokes a daemon's token as it ends the daemon (scale-down), and the
    daemon may send its next claim before the provider's SIGTERM reaches it: the 401
    (code token_revoked) means "stop", not a crash. Seen in CI: before the code, the
    daemon died with exit 1 on that claim."""
    settings.LAKESHORE_TOKEN_CACHE_SECONDS = 0  # the revocation holds from the next request
    builders.queue(name="e2e")
    proc = _start_daemon(live_server, tmp_path, "--queues", "e2e")
    wait_for(lambda: Daemon.objects.filter(state="idle").exists(), what="registration")
    daemon = Daemon.objects.get()
    ApiToken.objects.filter(user=daemon.owner).update(revoked_at=timezone.now())
    token_cache.clear()
    # its waiting claim wakes (fleet/0004: the revocation notifies it), checks the token
    # again and answers 401 token_revoked: the daemon learns at once, not after its wait
    assert proc.wait(15) == 0, _log(tmp_path)  # its wait is 50 s
    log = _log(tmp_path)
    assert f"daemon {daemon.pk} was removed on the server (its credential is revoked)" in log
    assert "error:" not in log


def test_the_daemon_speaks_with_its_own_credential_not_the_token_it_started_with(
    live_server, tmp_path
):
    """`lakeshore daemon run` registers with its token, then switches to the credential
    the server answers: the token it started with may not act as it."""
    builders.queue(name="e2e")
    inv, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="e2e")
    proc = _start_daemon(live_server, tmp_path, "--queues", "e2e")
    wait_for(lambda: Invocation.objects.get(pk=inv.pk).state == "succeeded", what="the job")
    daemon = Daemon.objects.select_related("token").get()
    started_with = ApiToken.objects.filter(user=daemon.owner, bound=False).get()
    assert daemon.token.bound and daemon.token_id != started_with.pk
    assert daemon.token.last_used_at is not None  # it spoke with the credential
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, _log(tmp_path)
    daemon.token.refresh_from_db()
    assert daemon.token.revoked_at is not None  # gone with its daemon


def test_the_daemon_beats_within_the_servers_timeout_whatever_it_was_told(
    live_server, tmp_path, settings
):
    """Issue 21's flap: a server timeout shorter than --heartbeat had a healthy busy
    daemon marked lost and its jobs run again. The daemon learns the timeout when it
    registers and beats every third of it. (Without that, this daemon's first beat
    would come 10 s after it registered, and the reaper below would find it lost.)"""
    settings.LAKESHORE_HEARTBEAT_TIMEOUT = 3
    queue = builders.queue(name="e2e")
    proc = _start_daemon(live_server, tmp_path, "--queues", "e2e", "--heartbeat", "10")
    try:
        wait_for(lambda: Daemon.objects.filter(state="idle").exists(), what="registration")
        job, _ = services.invocation_submit(
            queue=queue.name, function="lakeshore.functions.sleep", args=[7]
        )
        wait_for(lambda: Invocation.objects.get(pk=job.pk).state == "running", what="a run")
        for _ in range(7):  # the job runs past twice the timeout; the reaper looks each second
            time.sleep(1)
            assert daemons.reap(now=timezone.now())["lost"] == 0, _log(tmp_path)
        wait_for(lambda: Invocation.objects.get(pk=job.pk).state == "succeeded", what="its end")
        assert Invocation.objects.get(pk=job.pk).attempts == 1  # never run again
        assert "heartbeat every 1 s: a third of the server's 3 s timeout" in _log(tmp_path)
    finally:
        proc.terminate()
        proc.wait(20)


def test_an_idle_daemon_stops_at_once_though_its_claim_waits_20_s(live_server, tmp_path):
    """Issue 21: an idle daemon's claim waits 20 s, and it sends no heartbeat while it
    waits. On SIGTERM it tells the server it is draining (a heartbeat with drain), which
    wakes its waiting claim (the claim answers at once, saying draining), so it leaves in
    well under its wait. Parked all that time, it was never taken for lost."""
    builders.queue(name="e2e")
    proc = _start_daemon(live_server, tmp_path, "--queues", "e2e")
    try:
        wait_for(lambda: Daemon.objects.filter(state="idle").exists(), what="registration")
        time.sleep(3)  # its claim is waiting on the server
        assert daemons.reap(now=timezone.now())["lost"] == 0
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, _log(tmp_path)
        took = time.monotonic() - asked
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took < 10, (took, _log(tmp_path))  # well under its claim's 20 s wait
    assert Daemon.objects.get().state == "terminated"  # it deregistered
