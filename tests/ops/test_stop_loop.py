"""Issue 20, "Shutdown is out of order" and "Ctrl-C can leave a worker behind": every way
of stopping the real `make run`, in a loop. Each round starts it (the start must be
clean: no traceback, no stray line), lets the local provider's daemon come up (an
elastic queue with min 1), records every process of the start (the supervisor's tree,
the daemons, the embedded PostgreSQL), stops it, and asserts that all of them are gone
and the port free (within harness.GONE_WITHIN; how long each stop took is printed), and,
for every way but kill -9 of everything, that the daemon deregistered (it was not left
for the reaper to mark lost).

STOP_LOOPS rounds per way (1 in `make test`; `make stop-loop` runs 20). A control shows
the assertion fail: the web server stopped before the daemons, as make run used to."""

import json
import os
import time

import psutil
import pytest

from tests.ops.harness import MakeRun, alive, clean_start, deregistered

ROUNDS = int(os.environ.get("STOP_LOOPS", "1"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("make-run"),  # one sandbox, its rounds in order
    pytest.mark.skipif(
        bool(os.environ.get("DATABASE_URL")), reason="exercises the embedded PostgreSQL"
    ),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = MakeRun(tmp_path_factory.mktemp("make-run"))
    try:
        first = run.start()
        assert not clean_start(first), first
        # The first start prints the SDK's whole export line (later ones the command).
        assert f"  Python SDK: export LAKESHORE_URL={run.url} LAKESHORE_CLIENT_TOKEN=" in first
        assert run.cli("providers", "add", "here", "--kind", "local").returncode == 0
        added = run.cli(
            "queues", "add", "elastic", "--provider", "here",
            "--elasticity", "pool-with-threshold", "--min", "1", "--max", "1", "--threshold", "0.5",
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        run.wait_for_daemon()
        tree = run.tree()
        run.ctrl_c()
        run.wait_gone(tree, time.monotonic())
        yield run
    finally:
        run.clean_up()


def start_clean(run: MakeRun) -> None:
    text = run.start()
    assert not clean_start(text), text
    assert 'Python SDK: eval "$(lakeshore auth env --sdk)"' in text


def forget_killed_daemons(run: MakeRun) -> None:
    """Daemons killed with everything else stay live on the server until the reaper marks
    them lost (LAKESHORE_HEARTBEAT_TIMEOUT): remove them, so the controller starts one."""
    listed = run.cli("daemon", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    rows = rows.get("results", rows) if isinstance(rows, dict) else rows
    for row in rows:
        if row["state"] in ("provisioning", "idle", "busy", "draining"):
            running = {p.info["pid"] for p in psutil.process_iter(["pid"])}
            pid = (row.get("external_id") or "").removeprefix("pid:")
            if not pid.isdigit() or int(pid) not in running:
                run.cli("daemon", "remove", str(row["id"]))


def one_round(run: MakeRun, stop, *, graceful: bool = True) -> float:
    start_clean(run)
    daemon = run.wait_for_daemon()
    tree = run.tree()
    assert any("daemon run" in " ".join(p.cmdline()) for p in tree if alive(p)), tree
    started = time.monotonic()
    stop(tree)
    took = run.wait_gone(tree, started)
    assert not clean_start(run.output()), run.output()  # the stop's lines too
    if graceful:
        log = run.daemon_logs()[daemon]
        assert deregistered(log), log
        assert "Stopped." in run.output()
    return took


@pytest.mark.parametrize(
    "way",
    ["ctrl_c", "ctrl_c_twice", "sigterm", "parent_killed"],
)
def test_every_graceful_way_stops_everything_and_the_daemons_deregister(run, way):
    gaps = [0.05, 0.3, 1.0, 2.5]  # the second Ctrl-C lands in each step of the stop
    stops = {
        "ctrl_c": lambda tree: run.ctrl_c(),
        "ctrl_c_twice": lambda tree: run.ctrl_c_twice(gaps[len(took) % len(gaps)]),
        "sigterm": lambda tree: run.sigterm(),
        "parent_killed": lambda tree: run.kill_parent(),
    }
    took = []
    for _ in range(ROUNDS):
        took.append(one_round(run, stops[way]))
    print(f"{way}: {ROUNDS} rounds, stopped in {min(took):.1f}-{max(took):.1f} s")


def test_kill_9_of_everything_then_the_next_start_is_clean(run):
    """Everything killed at once, PostgreSQL included (a stale postmaster.pid, socket
    and lock file, the port possibly in TIME_WAIT): the next start recovers."""
    for _ in range(ROUNDS):
        start_clean(run)
        forget_killed_daemons(run)
        postgres = run.postgres()  # first: a backend may start (or end) at any moment
        tree = run.tree()
        assert postgres and all(p in tree or not p.is_running() for p in postgres)
        started = time.monotonic()
        run.kill_everything(tree)
        run.wait_gone(tree, started)
        assert (run.pgdata() / "postmaster.pid").exists()  # stale: the next start recovers
    start_clean(run)
    forget_killed_daemons(run)
    run.wait_for_daemon()
    tree = run.tree()
    run.ctrl_c()
    run.wait_gone(tree, time.monotonic())


def test_control_the_web_server_stopped_first_leaves_the_daemon_unregistered(run):
    """The old order, by hand: gunicorn stopped before the daemons. The daemon cannot
    deregister, and the assertion the rounds use sees it."""
    start_clean(run)
    forget_killed_daemons(run)
    daemon = run.wait_for_daemon()
    tree = run.tree()
    gunicorn = [p for p in tree if "gunicorn" in " ".join(p.cmdline()[:2])]
    master = min(gunicorn, key=lambda p: p.create_time())
    master.terminate()
    psutil.wait_procs(gunicorn, timeout=10)
    started = time.monotonic()
    run.ctrl_c()
    run.wait_gone(tree, started)
    log = run.daemon_logs()[daemon]
    assert "could not deregister" in log
    assert not deregistered(log)
