"""`make bench`'s peers on Redis (bench/compare/celery_driver.py, rq_driver.py), small:
a private redis-server on a unix socket, each peer's submit rows and its end-to-end run
in every configuration, all their jobs done, and no worker process left behind, even
when a measurement fails midway. Then the Targets table judges Lakeshore against each
peer's own column, and against its floors. Skipped without Debian's redis-server."""

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from rq import Queue

from bench.compare import report
from bench.compare.celery_driver import CONFIGS, CeleryPeer
from bench.compare.infra import REDIS_SERVER, ROOT, Redis, start_group, stop_group
from bench.compare.rowkit import CELERY, JOBS_PER_S, LAKESHORE, PROCRASTINATE, RAW, RQ, Row
from bench.compare.rq_driver import RQPeer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(REDIS_SERVER).exists(), reason="no redis-server: apt-get install redis-server"
    ),
]


def _left_over(marker: str) -> list[str]:
    """The processes but this one and redis-server whose command line or environment
    names `marker` (the test's own socket path or log folder)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            words = " ".join(process.info["cmdline"] or [])
            if marker not in words:
                words += " ".join(f"{k}={v}" for k, v in process.environ().items())
        except psutil.Error:
            continue
        mine = process.pid == psutil.Process().pid or words.startswith(REDIS_SERVER)
        if marker in words and not mine:
            found.append(f"{process.pid} {words[:200]}")
    return found


@pytest.fixture
def redis_server(tmp_path):
    server = Redis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()
    assert not _left_over(str(server.socket)), "a process outlived the bench's Redis"


def test_celery_submits_and_runs_every_job_in_both_configurations(redis_server, tmp_path):
    celery = CeleryPeer(redis_server, logs=tmp_path)
    celery.setup()
    try:
        assert celery.submit_one(0.2) > 0
        assert celery.batch(20, 0.2) > 0
        assert celery.e2e(2, 30, 30.0) > 0
        for config in CONFIGS:
            assert len(celery.configs[2][config]) == 1
        assert "task_acks_late = True" in celery.notes()
    finally:
        celery.close()
    assert not _left_over(str(redis_server.socket))


def test_rq_submits_and_runs_every_job_with_a_worker_each(redis_server, tmp_path):
    rq = RQPeer(redis_server, logs=tmp_path)
    rq.setup()
    try:
        assert rq.submit_one(0.2) > 0
        assert rq.batch(20, 0.2) > 0
        assert rq.e2e(2, 20, 30.0) > 0
        assert sorted(path.name for path in tmp_path.glob("rq-c2-*.log")) == [
            "rq-c2-0.log",
            "rq-c2-1.log",
        ]
    finally:
        rq.close()
    assert not _left_over(str(redis_server.socket))


def test_a_failed_measurement_leaves_no_worker_behind(redis_server, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("the broker went away")

    rq = RQPeer(redis_server, logs=tmp_path)
    rq.setup()
    monkeypatch.setattr(Queue, "enqueue_many", refuse)
    with pytest.raises(RuntimeError, match="went away"):
        rq.e2e(2, 10, 5.0)
    rq.close()

    celery = CeleryPeer(redis_server, logs=tmp_path)
    celery.setup()
    monkeypatch.setattr("bench.compare.celery_driver.group", refuse)
    with pytest.raises(RuntimeError, match="went away"):
        celery.e2e(2, 10, 5.0)
    celery.close()
    assert not _left_over(str(redis_server.socket))
    assert not _left_over(str(tmp_path))


FORK_AND_LEAVE = """
import os, time
if os.fork() == 0:
    os.setsid()  # as RQ's work horse does: out of the worker's process group
    print(os.getpid(), flush=True)
time.sleep(60)
"""


def test_stop_group_ends_a_child_that_left_the_group(tmp_path):
    out = tmp_path / "out"
    leader = start_group([sys.executable, "-c", FORK_AND_LEAVE], env={}, log=out)
    deadline = time.monotonic() + 10
    while not out.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.02)
    child = int(out.read_text())
    stop_group(leader)
    assert leader.returncode is not None
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child) and time.monotonic() < deadline:
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.Error:
            break
        time.sleep(0.02)
    else:
        assert not psutil.pid_exists(child), "the child that left the group outlived it"


DIE_LEAVING_A_WORKER = """
import os, sys
from pathlib import Path
from bench.compare.infra import start_group
sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
worker = start_group(sleeper, env={}, log=Path(sys.argv[1]))
print(worker.pid, flush=True)
os.kill(os.getpid(), 9)  # the bench killed: no finally, no stop_group
"""


def test_a_worker_dies_with_a_bench_killed_before_it_could_stop_it(tmp_path):
    bench = subprocess.run(
        [sys.executable, "-c", DIE_LEAVING_A_WORKER, str(tmp_path / "log")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    worker = int(bench.stdout)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if psutil.Process(worker).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)
    psutil.Process(worker).kill()
    raise AssertionError("the worker outlived the bench that started it")


def _result(key: str, values: dict[str, float], **fields) -> report.RowResult:
    row = Row(key, key, JOBS_PER_S, True, {}, **fields)
    return report.RowResult(row, {system: [value] for system, value in values.items()})


def test_targets_judge_each_peer_and_the_floors():
    pool = _result("e2e-c8", {LAKESHORE: 900, PROCRASTINATE: 400, CELERY: 1000})
    process = _result("e2e-c8-process", {LAKESHORE: 300, RQ: 250}, procrastinate_from="e2e-c8")
    submit = _result("submit-one", {LAKESHORE: 90, PROCRASTINATE: 300}, floor=lambda: 0.9)
    cancel = report.RowResult(
        Row("bulk-cancel", "bulk-cancel", "s", False, {}, floor=lambda: 1.4),
        {LAKESHORE: [2.0], RAW: [0.7]},
    )
    section = report.SectionResult("all", [pool, process, submit, cancel])
    text = report.render([section], facts=[], skipped=[], extra={})
    lines = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()}

    def verdict(start: str) -> str:
        return next(line for label, line in lines.items() if label.startswith(start))

    assert "| 0.90× | not met" in verdict("end to end, concurrency 8, --isolation pool ≥ 1× Cel")
    assert "| 2.25× | met" in verdict("end to end, concurrency 8, --isolation pool ≥ 2× pro")
    assert "| 1.20× | met" in verdict("end to end, concurrency 8, --isolation process ≥ 1× RQ")
    assert "| 0.75× | met" in verdict("end to end, concurrency 8, --isolation process ≥ 0.75×")
    assert "| 0.90× (0.30× defer) | met" in verdict("one submit over HTTP")
    assert "| 1.40× (2.86× raw SQL's UPDATE) | not met" in verdict("bulk-cancel 100,000")
    header = next(line for line in text.splitlines() if line.startswith("| | unit"))
    assert "| Celery | RQ |" in header and "Lakeshore ÷ Celery | Lakeshore ÷ RQ" in header
