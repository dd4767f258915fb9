"""`lakeshore daemon run --isolation pool|process` against the live server: warm job
processes are reused, replaced after a failure, a timeout or --max-tasks-per-worker;
process isolation starts one per invocation; outcomes are reported in batches. The job
functions are in tests/daemon/poolfuncs.py; each returns the pid it ran in."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import services
from jobs.models import Invocation
from tests.daemon.jobfuncs import alive
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
LAKESHORE = str(Path(sys.executable).parent / "lakeshore")
FUNCS = "tests.daemon.poolfuncs"
OWN = ("LAKESHORE_ALLOWED_MODULES", "LAKESHORE_JOB_ENV", "LAKESHORE_CLIENT_TOKEN")
FINISHED = ("succeeded", "failed", "timeout", "killed")


@pytest.fixture
def daemon(live_server, tmp_path):
    """start(*args) → a `lakeshore daemon run --verbose` process serving the queue e2e,
    allowed to run tests.daemon.poolfuncs (its log: tmp_path/daemon.log)."""
    started: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k not in OWN}
        env |= {
            "LAKESHORE_URL": live_server.url,
            "LAKESHORE_TOKEN": builders.token("daemon"),
            "XDG_CONFIG_HOME": str(tmp_path),
            "PYTHONPATH": str(ROOT),
            "LAKESHORE_ALLOWED_MODULES": FUNCS,
        }
        log = open(tmp_path / "daemon.log", "w")  # noqa: SIM115 - the process owns it
        proc = subprocess.Popen(
            [LAKESHORE, "daemon", "run", "--heartbeat", "1", "--queues", "e2e", "-v", *args],
            env=env,
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        started.append(proc)
        return proc

    builders.queue(name="e2e")
    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _wait_for(condition, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    assert condition(), f"timed out after {timeout:.0f} s waiting for {what}"


def _log(tmp_path) -> str:
    return (tmp_path / "daemon.log").read_text()


def _run(function: str, *args, **fields) -> Invocation:
    """Submits one invocation and waits for its end (one at a time: concurrency 1 runs
    them on the same slot, in this order)."""
    inv, _ = services.invocation_submit(
        function=f"{FUNCS}.{function}", queue="e2e", args=list(args), **fields
    )
    _wait_for(lambda: Invocation.objects.get(pk=inv.pk).state in FINISHED, what=f"{function}'s end")
    inv.refresh_from_db()
    return inv


def _ok(function: str, *args):
    inv = _run(function, *args)
    assert inv.state == "succeeded", inv.error
    return inv.result


def _stop(proc, tmp_path) -> str:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, _log(tmp_path)
    return _log(tmp_path)


def test_a_global_survives_in_the_warm_process_until_a_failure_replaces_it(daemon, tmp_path):
    proc = daemon("--concurrency", "1")
    first = _ok("set_global", "left by a job")
    # The negative control: no failure in between, so the same process runs the next
    # job and it sees the global. Without it, the check after the failure proves nothing.
    assert _ok("get_global") == {"pid": first["pid"], "value": "left by a job"}
    failed = _run("fail", "boom")
    assert failed.state == "failed" and "RuntimeError: boom" in failed.error
    after = _ok("get_global")
    assert after["value"] is None, "a job saw a global set before a failure"
    assert after["pid"] != first["pid"]
    assert not alive(first["pid"])
    log = _stop(proc, tmp_path)
    assert f"job process {first['pid']} replaced (the invocation failed)" in log


def test_a_timeout_in_pool_mode_kills_and_replaces_the_process(daemon, tmp_path):
    proc = daemon("--concurrency", "1")
    before = _ok("pid")
    pidfile = tmp_path / "pid"
    slow = _run("write_pid_then_sleep", str(pidfile), 300, timeout_s=1)
    assert (slow.state, slow.error) == ("timeout", "stopped after timeout_s=1 s")
    old = int(pidfile.read_text())
    assert old == before  # it ran in the warm process
    _wait_for(lambda: not alive(old), timeout=20, what=f"process {old} to die")
    after = _ok("pid")  # the next job runs, in a new process
    assert after != old
    _stop(proc, tmp_path)


def test_max_tasks_per_worker_replaces_the_process_after_that_many(daemon, tmp_path):
    proc = daemon("--concurrency", "1", "--max-tasks-per-worker", "3")
    pids = [_ok("pid") for _ in range(7)]
    assert len(set(pids[0:3])) == len(set(pids[3:6])) == 1, pids
    assert len({pids[0], pids[3], pids[6]}) == 3, pids
    log = _stop(proc, tmp_path)
    assert f"job process {pids[0]} replaced (it ran 3 invocations)" in log


def test_process_isolation_gives_each_job_a_fresh_process(daemon, tmp_path):
    proc = daemon("--concurrency", "1", "--isolation", "process")
    first = _ok("set_global", "here")
    second = _ok("get_global")
    assert second["value"] is None
    pids = [first["pid"], second["pid"], *(_ok("pid") for _ in range(3))]
    assert len(set(pids)) == len(pids), pids
    assert not any(alive(pid) for pid in pids)
    _stop(proc, tmp_path)


def test_many_quick_jobs_each_run_once_and_are_reported_in_batches(daemon, tmp_path):
    ledger = tmp_path / "ledger"
    jobs = 200
    ids = [
        services.invocation_submit(function=f"{FUNCS}.record", queue="e2e", args=[str(ledger), n])[
            0
        ].pk
        for n in range(jobs)
    ]
    proc = daemon("--concurrency", "8")
    _wait_for(
        lambda: not Invocation.objects.filter(pk__in=ids).exclude(state="succeeded").exists(),
        timeout=120,
        what="every job to succeed",
    )
    log = _stop(proc, tmp_path)
    runs = [line.split()[0] for line in ledger.read_text().splitlines()]
    assert sorted(runs, key=int) == [str(n) for n in range(jobs)]  # each exactly once
    assert set(Invocation.objects.filter(pk__in=ids).values_list("attempts", flat=True)) == {1}
    succeeded = re.findall(r"invocation (\d+): succeeded in", log)
    assert sorted(map(int, succeeded)) == sorted(ids)
    assert f"stopped ({jobs} succeeded, 0 failed, 0 timeout, 0 killed)" in log
    reported = re.findall(r"reported (\d+) outcome\(s\) in (\d+) request", log)
    batches = [(int(n), int(r)) for n, r in reported]
    assert sum(n for n, _ in batches) == jobs
    requests = sum(r for _, r in batches)
    assert requests < jobs, f"{requests} complete requests for {jobs} jobs: no batching"
    assert max(n for n, _ in batches) > 1
    assert "refused held ids" not in log  # its heartbeats said what it held


def _spans(ledger: Path) -> tuple[list[int], int]:
    """The runs in the ledger, and the most that ran at once."""
    runs, edges = [], []
    for line in ledger.read_text().splitlines():
        n, start, end = line.split()
        runs.append(int(n))
        edges += [(float(start), 1), (float(end), -1)]
    at_once = most = 0
    for _, step in sorted(edges, key=lambda edge: (edge[0], edge[1])):  # ends first on ties
        at_once += step
        most = max(most, at_once)
    return runs, most


def _claim_limits(log: str) -> list[int]:
    return [int(n) for n in re.findall(r"claimed \d+ \(limit (\d+)\)", log)]


def _span_jobs(ledger: Path, jobs: int, seconds: float) -> list[int]:
    items = [
        {"function": f"{FUNCS}.span", "queue": "e2e", "args": [str(ledger), n, seconds]}
        for n in range(jobs)
    ]
    return [inv.pk for inv, _ in services.invocation_submit_batch(items)]


def test_short_jobs_are_claimed_ahead_yet_never_more_run_at_once_than_the_slots(daemon, tmp_path):
    ledger = tmp_path / "ledger"
    ids = _span_jobs(ledger, 150, 0.002)
    proc = daemon("--concurrency", "2")
    _wait_for(
        lambda: not Invocation.objects.filter(pk__in=ids).exclude(state="succeeded").exists(),
        timeout=120,
        what="every job to succeed",
    )
    log = _stop(proc, tmp_path)
    runs, most = _spans(ledger)
    assert sorted(runs) == list(range(150))  # each exactly once
    assert most <= 2  # the jobs claimed ahead waited for a slot
    assert max(_claim_limits(log)) > 2  # it asked for more than its free slots
    assert "stopped (150 succeeded, 0 failed, 0 timeout, 0 killed)" in log


def test_long_jobs_are_not_claimed_ahead(daemon, tmp_path):
    ledger = tmp_path / "ledger"
    ids = _span_jobs(ledger, 6, 0.3)
    proc = daemon("--concurrency", "2")
    _wait_for(
        lambda: not Invocation.objects.filter(pk__in=ids).exclude(state="succeeded").exists(),
        timeout=60,
        what="every job to succeed",
    )
    log = _stop(proc, tmp_path)
    runs, most = _spans(ledger)
    assert sorted(runs) == list(range(6)) and most <= 2
    limits = _claim_limits(log)
    assert limits and max(limits) <= 2  # never more than its free slots


def test_more_slots_than_one_claim_may_ask_for_still_claim(daemon, tmp_path):
    """--concurrency goes to 256; one claim asks for at most 100 (the server's limit)."""
    ledger = tmp_path / "ledger"
    ids = _span_jobs(ledger, 3, 0.01)
    proc = daemon("--concurrency", "150", "--isolation", "process")
    _wait_for(
        lambda: not Invocation.objects.filter(pk__in=ids).exclude(state="succeeded").exists(),
        timeout=60,
        what="every job to succeed",
    )
    log = _stop(proc, tmp_path)
    # no 400 (a limit over the server's) anywhere: a status, not a digit run in a name
    assert max(_claim_limits(log)) == 100 and not re.search(r"\b400\b", log)
