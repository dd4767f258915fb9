"""Dispatch safety of a real `lakeshore daemon run` process against the live server: job
processes die with their daemon and with their stop, see no server secret, and run
only what the daemon allows. Each test is named after the fault it pins down; the job
functions are in tests/daemon/jobfuncs.py."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from fleet.daemons import reap
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from lakeshore.pool.processes import kill_job_group, start_job_process
from tests.daemon import jobfuncs
from tests.daemon.jobfuncs import alive, starts
from tests.support import builders

pytestmark = [pytest.mark.slow]
live = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]  # the repository: PYTHONPATH for tests.daemon
LAKESHORE = str(Path(sys.executable).parent / "lakeshore")
FUNCS = "tests.daemon.jobfuncs"
# Seconds by which a job process dies with its daemon or its stop: at once (the kernel's
# PR_SET_PDEATHSIG, a signal to its group), where the old way it lived on through its
# sleep of minutes. Ten times the 2 s, for a loaded machine.
GONE_WITHIN = 20.0
# The daemon's own settings: left out of the base environment, set per test.
OWN = ("LAKESHORE_ALLOWED_MODULES", "LAKESHORE_JOB_ENV", "LAKESHORE_CLIENT_TOKEN")


@pytest.fixture(params=["pool", "process"])
def isolation(request) -> str:
    """Every test that starts a daemon runs with each --isolation."""
    return request.param


@pytest.fixture
def daemons(live_server, tmp_path, isolation):
    """start(name, *args, allowed=True, **env) → a `lakeshore daemon run` process (its
    log: tmp_path/NAME.log) with this test's --isolation. Whatever still runs at the end
    is killed."""
    started: list[subprocess.Popen] = []

    def start(name: str, *args: str, allowed: bool = True, **env: str) -> subprocess.Popen:
        full = {k: v for k, v in os.environ.items() if k not in OWN}
        full |= {
            "LAKESHORE_URL": live_server.url,
            "LAKESHORE_TOKEN": builders.token("daemon"),
            "XDG_CONFIG_HOME": str(tmp_path),
            "PYTHONPATH": str(ROOT),
        }
        if allowed:
            full["LAKESHORE_ALLOWED_MODULES"] = FUNCS
        full |= env
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - the process owns it
        proc = subprocess.Popen(
            [
                *(LAKESHORE, "daemon", "run", "--heartbeat", "1", "--queues", "e2e"),
                *("--isolation", isolation, *args),
            ],
            env=full,
            cwd=tmp_path,  # not the repository: tests.daemon comes from PYTHONPATH
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        proc.tmp_path = tmp_path  # where _stop finds its log
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _wait_for(condition, timeout=30.0, what="condition", every=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(every)
    assert condition(), f"timed out after {timeout:.1f} s waiting for {what}"


def _gone_within(pid: int, since: float, what: str) -> float:
    """Asserts `pid` is gone (exited or a zombie) by `since` + GONE_WITHIN (monotonic);
    returns the wall-clock time it was seen gone."""
    left = since + GONE_WITHIN - time.monotonic()
    _wait_for(lambda: not alive(pid), max(left, 0.0), what, every=0.02)
    return time.time()


def _stop(proc: subprocess.Popen, log: str = "") -> int:
    """SIGTERM, then its exit status; a daemon still running 20 s later fails the test
    with its log (`log`: the name it was started under)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        text = _log(proc.tmp_path, log) if log and hasattr(proc, "tmp_path") else ""
        raise AssertionError(f"the daemon did not stop within 20 s of SIGTERM:\n{text}") from None


def _state(inv) -> str:
    return Invocation.objects.get(pk=inv.pk).state


def _log(tmp_path, name: str) -> str:
    return (tmp_path / f"{name}.log").read_text()


def _kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _ended(ledger) -> set[int]:
    return {int(line.split()[1]) for line in ledger.read_text().splitlines() if line[:4] == "end "}


@live
def test_kill_9_of_the_daemon_kills_its_job_so_the_requeued_run_never_overlaps(daemons, tmp_path):
    builders.queue(name="e2e")
    ledger = tmp_path / "ledger"
    inv, _ = services.invocation_submit(
        function=f"{FUNCS}.ledger_sleep", queue="e2e", args=[str(ledger), 300], max_attempts=2
    )
    first = daemons("first")
    _wait_for(lambda: len(starts(ledger)) == 1, what="the job's start")
    job = starts(ledger)[0]["pid"]
    assert alive(job)

    killed = time.monotonic()
    os.kill(first.pid, signal.SIGKILL)  # the daemon alone, not its process group
    gone_at = _gone_within(job, killed, f"job process {job} to die with its daemon")
    first.wait(10)
    assert _state(inv) == "running"  # the server cannot know yet

    report = reap(now=timezone.now() + timedelta(seconds=settings.LAKESHORE_HEARTBEAT_TIMEOUT + 1))
    assert report["lost"] == 1
    inv.refresh_from_db()
    assert (inv.state, inv.attempts, inv.daemon_id) == ("queued", 1, None)

    second = daemons("second")
    _wait_for(lambda: _state(inv) == "succeeded", what="the second run")
    assert _stop(second, "second") == 0, _log(tmp_path, "second")
    inv.refresh_from_db()
    runs = starts(ledger)
    assert len(runs) == 2, ledger.read_text()
    assert runs[1]["overlap"] == [], "the second run started while the first still ran"
    assert runs[1]["time"] > gone_at
    assert job not in _ended(ledger)  # the first run never finished: it was killed
    assert (inv.attempts, inv.result) == (2, runs[1]["pid"])


@live
def test_a_daemon_marked_lost_kills_its_copy_before_it_runs_the_work_again(daemons, tmp_path):
    builders.queue(name="e2e")
    ledger = tmp_path / "ledger"
    inv, _ = services.invocation_submit(
        function=f"{FUNCS}.ledger_sleep", queue="e2e", args=[str(ledger), 300], max_attempts=2
    )
    proc = daemons("daemon")
    _wait_for(lambda: len(starts(ledger)) == 1, what="the job's start")
    job = starts(ledger)[0]["pid"]
    # The reaper thinks the daemon silent (a `now` past the timeout) and hands its work
    # back: the daemon's next heartbeat gets 409 daemon_lost.
    report = reap(now=timezone.now() + timedelta(seconds=settings.LAKESHORE_HEARTBEAT_TIMEOUT + 1))
    assert report["lost"] == 1
    _wait_for(lambda: _state(inv) == "succeeded", what="the run after registering again")
    assert _stop(proc, "daemon") == 0, _log(tmp_path, "daemon")
    log = _log(tmp_path, "daemon")
    assert "was marked lost" in log and "registering again" in log, log
    runs = starts(ledger)
    assert len(runs) == 2, ledger.read_text()
    assert runs[1]["overlap"] == [], "the rerun started while the lost copy still ran"
    assert job not in _ended(ledger) and not alive(job)
    assert list(Daemon.objects.order_by("pk").values_list("state", flat=True)) == [
        "lost",
        "terminated",  # the second registration, deregistered on SIGTERM
    ]


@live
def test_the_jobs_environment_holds_no_server_secret(daemons, tmp_path):
    builders.queue(name="e2e")
    inv, _ = services.invocation_submit(function=f"{FUNCS}.environment", queue="e2e")
    token = builders.token("daemon")
    secrets = {
        "DATABASE_URL": "postgresql://lakeshore:db-password@db.invalid/lakeshore",
        "DJANGO_SECRET_KEY": "django-secret-key-value",
        "LAKESHORE_TOKEN": token,  # the daemon needs it itself
        "LAKESHORE_CLIENT_TOKEN": token,
        "LAKESHORE_BROKER_URL": "redis://:broker-password@broker.invalid:6379/0",
        "CELERY_BROKER_URL": "redis://:celery-password@broker.invalid:6379/0",
        "SOME_SECRET": "some-secret-value",
    }
    # The operator's extra names pass, but never a server setting, even if named.
    extra = "JOB_VISIBLE, DATABASE_URL, DJANGO_SECRET_KEY, LAKESHORE_TOKEN, CELERY_BROKER_URL"
    proc = daemons("daemon", **secrets, JOB_VISIBLE="yes", LAKESHORE_JOB_ENV=extra)
    _wait_for(lambda: _state(inv) not in ("queued", "running"), what="the job")
    assert _stop(proc, "daemon") == 0, _log(tmp_path, "daemon")
    inv.refresh_from_db()
    assert inv.state == "succeeded", inv.error
    env = inv.result
    assert not set(secrets) & set(env), sorted(env)
    leaked = [name for name, value in env.items() for s in secrets.values() if s in value]
    assert leaked == []
    assert env["LAKESHORE_INVOCATION_ID"] == str(inv.pk)
    assert env["LAKESHORE_ATTEMPT"] == "1"
    assert env["PATH"] == os.environ["PATH"]
    assert env["JOB_VISIBLE"] == "yes"
    ours = {"LAKESHORE_INVOCATION_ID", "LAKESHORE_ATTEMPT"}
    server = ("LAKESHORE_", "DJANGO_", "DATABASE_", "CELERY_", "XDG_CONFIG_HOME")
    assert [n for n in env if n.startswith(server) and n not in ours] == []
    assert "never passing DATABASE_URL, DJANGO_SECRET_KEY" in _log(tmp_path, "daemon")


@live
def test_jobs_see_the_daemons_allowed_modules_although_the_variable_is_not_passed(
    daemons, tmp_path
):
    builders.queue(name="e2e")
    refused, _ = services.invocation_submit(function=f"{FUNCS}.environment", queue="e2e")
    proc = daemons("without", allowed=False)
    _wait_for(lambda: _state(refused) == "failed", what="the refusal")
    assert _stop(proc, "without") == 0, _log(tmp_path, "without")
    refused.refresh_from_db()
    assert "not in an allowed module" in refused.error
    assert "this daemon runs lakeshore.functions (" in refused.error

    ran, _ = services.invocation_submit(function=f"{FUNCS}.environment", queue="e2e")
    proc = daemons("with", allowed=True)
    _wait_for(lambda: _state(ran) == "succeeded", what="the run")
    assert _stop(proc, "with") == 0, _log(tmp_path, "with")
    ran.refresh_from_db()
    assert "LAKESHORE_ALLOWED_MODULES" not in ran.result  # it came in the payload


@live
def test_a_timeout_kills_the_jobs_grandchildren_too(daemons, tmp_path):
    builders.queue(name="e2e")
    ledger = tmp_path / "ledger"
    inv, _ = services.invocation_submit(
        function=f"{FUNCS}.with_grandchild", queue="e2e", args=[str(ledger), 300], timeout_s=1
    )
    proc = daemons("daemon")
    grandchild = None
    try:
        _wait_for(lambda: "grandchild" in _text(ledger), what="the grandchild's start")
        grandchild = int(_text(ledger).split("grandchild ")[1].split()[0])
        _wait_for(lambda: _state(inv) == "timeout", what="the timeout")
        _gone_within(grandchild, time.monotonic(), f"grandchild {grandchild} to die")
        assert proc.poll() is None  # the daemon itself carries on
        assert _stop(proc, "daemon") == 0, _log(tmp_path, "daemon")
    finally:
        if grandchild is not None:
            _kill_quietly(grandchild)


def _text(path) -> str:
    return path.read_text() if path.exists() else ""


# ---------------------------------------------------------------- negative controls
# The same faults with a process started or stopped the old way: they show that the
# tests above pass because of the daemon's changes, not because of this machine.

PARENT = """
import os, subprocess, time
from lakeshore.pool.processes import start_job_process
new = start_job_process(["sleep", "60"], {"PATH": os.environ["PATH"]})
old = subprocess.Popen(["sleep", "60"])  # the old way: no PDEATHSIG, the parent's group
print(new.pid, old.pid, flush=True)
time.sleep(60)
"""


def test_control_a_child_started_the_old_way_survives_a_kill_9_of_its_parent():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    new, old = (int(pid) for pid in parent.stdout.readline().split())
    try:
        killed = time.monotonic()
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        _gone_within(new, killed, "the job-way child to die with its parent")
        assert alive(old), "the old-way child should outlive its parent"
    finally:
        parent.stdout.close()
        _kill_quietly(new)
        _kill_quietly(old)


def test_control_killing_only_the_job_process_leaves_its_grandchild(tmp_path):
    pidfile = tmp_path / "grandchild"
    job = start_job_process(
        ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], {"PATH": os.environ["PATH"]}
    )
    job.stdin.close()
    grandchild = None
    try:
        _wait_for(lambda: _text(pidfile).strip(), what="the grandchild's pid")
        grandchild = int(_text(pidfile))
        job.kill()  # the old way: the job process alone
        job.wait(10)
        assert alive(grandchild), "killing the job process alone should leave its child"
        stopped = time.monotonic()
        kill_job_group(job)  # the new way: its whole group
        _gone_within(grandchild, stopped, "the grandchild to die with the job's group")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(10)
        if grandchild is not None:
            _kill_quietly(grandchild)


def test_control_the_ledgers_alive_counts_a_zombie_as_gone():
    assert alive(os.getpid())
    child = subprocess.Popen(["true"])
    _wait_for(lambda: not alive(child.pid), what="the child to exit")
    assert Path(f"/proc/{child.pid}").exists()  # exited, not reaped yet: a zombie
    child.wait()
    assert not alive(child.pid)
    assert jobfuncs.starts("/nonexistent/ledger") == []
