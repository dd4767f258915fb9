"""The daemon's job processes without a server: lakeshore.pool.pool.Pool started from this
test's thread (the spawner), running the functions of tests/daemon/poolfuncs.py in real
`lakeshore.runner` processes."""

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from lakeshore.pool.job_process import Running
from lakeshore.pool.pool import Pool
from lakeshore.worker.environment import job_environment
from tests.daemon.jobfuncs import alive

ROOT = Path(__file__).resolve().parents[2]
FUNCS = "tests.daemon.poolfuncs"


class Harness:
    """A pool and the outcomes it delivered, by invocation id."""

    def __init__(self, environment=None, **options):
        self.lock = threading.RLock()
        self.ended = threading.Condition(self.lock)
        self.outcomes: dict[str, tuple[str, object, str]] = {}
        self.printed: dict[str | None, list[tuple[str, str]]] = {}  # id → (stream, line)
        self.printed_at_outcome: dict[str, int] = {}  # lines it had when it ended
        self.ids = iter(range(1, 1_000_000))
        self.pool = Pool(
            environment=environment or self.environment,
            done=self.done,
            lock=self.lock,
            spawner=threading.current_thread(),
            allowed_modules=(FUNCS,),
            log=lambda message: None,
            output=self.output,
            **{"size": 1, "isolation": "pool", **options},
        )

    @staticmethod
    def environment(invocation):
        source = {**os.environ, "PYTHONPATH": str(ROOT)}
        return job_environment(source, [], invocation)

    def done(self, item, state, result, error):
        with self.ended:  # the pool calls it from its threads, or from start itself
            self.outcomes[item.id] = (state, result, error)
            self.printed_at_outcome[item.id] = len(self.printed.get(item.id, []))
            self.ended.notify_all()

    def output(self, item, pid, stream, lines):
        with self.lock:
            key = item.id if item is not None else None
            self.printed.setdefault(key, []).extend((stream, line) for line in lines)

    def lines(self, item, stream=None) -> list[str]:
        with self.lock:
            got = self.printed.get(item.id, [])
            return [line for s, line in got if stream is None or s == stream]

    def start(self, function: str, *args, timeout_s=None) -> Running:
        invocation = {
            "id": next(self.ids),
            "attempts": 1,
            "function": f"{FUNCS}.{function}",
            "args": list(args),
            "kwargs": {},
            "timeout_s": timeout_s,
        }
        item = Running(invocation)
        self.pool.start(item)
        return item

    def wait(self, item: Running, timeout: float = 20.0) -> tuple[str, object, str]:
        deadline = time.monotonic() + timeout
        with self.lock:
            while item.id not in self.outcomes:
                left = deadline - time.monotonic()
                assert left > 0, f"no outcome for invocation {item.id}"
                self.ended.wait(left)
            return self.outcomes[item.id]

    def run(self, function: str, *args, timeout_s=None):
        """Runs one invocation (after warming the pool as the claim loop does): its
        (state, result, error)."""
        self.pool.prepare()
        return self.wait(self.start(function, *args, timeout_s=timeout_s))

    def ok(self, function: str, *args):
        state, result, error = self.run(function, *args)
        assert state == "succeeded", error
        return result


@pytest.fixture
def harness():
    made: list[Harness] = []

    def make(**options) -> Harness:
        made.append(Harness(**options))
        return made[-1]

    yield make
    for h in made:
        h.pool.close()


def gone(pid: int, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _text(path: Path, within: float = 30.0) -> str:
    deadline = time.monotonic() + within
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"nothing in {path}"
        time.sleep(0.01)
    return path.read_text().strip()


def test_a_pool_process_runs_one_invocation_after_another_and_keeps_module_state(harness):
    """The negative control of the replacement tests: without a failure in between, the
    same process runs the next invocation and sees what the one before left."""
    h = harness()
    first = h.ok("set_global", "left by the first")
    second = h.ok("get_global")
    assert second == {"pid": first["pid"], "value": "left by the first"}
    assert h.ok("pid") == first["pid"]


def test_a_failed_invocation_replaces_the_process(harness):
    h = harness()
    first = h.ok("set_global", "left behind")
    state, _, error = h.run("fail", "boom")
    assert state == "failed" and "RuntimeError: boom" in error and "Traceback" in error
    after = h.ok("get_global")
    assert after["value"] is None  # a new process: the module was imported afresh
    assert after["pid"] != first["pid"]
    assert gone(first["pid"])


def test_a_process_is_replaced_after_max_tasks(harness):
    h = harness(max_tasks=2)
    pids = [h.ok("pid") for _ in range(5)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]
    assert gone(pids[0]) and gone(pids[2])


def test_no_task_limit_with_zero(harness):
    h = harness(max_tasks=0)
    assert len({h.ok("pid") for _ in range(5)}) == 1


def test_a_process_above_the_memory_limit_is_replaced(harness):
    h = harness(max_memory_mb=60)
    small = [h.ok("pid") for _ in range(2)]
    assert small[0] == small[1]  # control: under the limit, kept
    big = h.ok("allocate", 100)
    assert big == small[0]  # it ran there, and the process is replaced after it
    assert h.ok("pid") != big
    assert gone(big)


def test_a_timeout_kills_and_replaces_the_process(harness, tmp_path):
    h = harness()
    pidfile = tmp_path / "pid"
    state, _, error = h.run("write_pid_then_sleep", str(pidfile), 300, timeout_s=0.5)
    assert (state, error) == ("timeout", "stopped after timeout_s=0.5 s")
    old = int(_text(pidfile))
    assert gone(old)
    assert h.ok("pid") != old


def test_process_isolation_runs_each_invocation_in_a_fresh_process(harness):
    h = harness(isolation="process", size=2)
    first = h.ok("set_global", "here")
    second = h.ok("get_global")
    assert second["value"] is None and second["pid"] != first["pid"]
    pids = {h.ok("pid") for _ in range(3)}
    assert len(pids) == 3 and first["pid"] not in pids
    assert h.pool.pids() == []  # nothing kept between invocations


@pytest.mark.parametrize("isolation", ["pool", "process"])
def test_a_process_that_exits_ends_its_invocation_failed(harness, isolation):
    h = harness(isolation=isolation)
    state, _, error = h.run("exit_now", 3)
    assert (state, error) == ("failed", "the invocation's process exited with code 3")
    assert h.ok("pid") > 0  # and the next one runs


@pytest.mark.parametrize(
    "function", ["leave_child", "leave_orphan"], ids=["child", "orphaned grandchild"]
)
def test_what_an_invocation_left_running_is_killed_and_its_process_replaced(
    harness, tmp_path, function
):
    h = harness()
    pidfile = tmp_path / "left"
    runner = h.ok(function, str(pidfile))
    left = int(_text(pidfile))
    assert gone(left), f"process {left} left by the invocation still runs"
    assert h.ok("pid") != runner
    assert gone(runner)


def test_a_thread_left_running_replaces_the_process(harness):
    h = harness()
    runner = h.ok("leave_thread", 30)
    assert h.ok("pid") != runner


def test_environment_and_directory_are_put_back_between_invocations(harness):
    h = harness()
    changed = h.ok("change_environment")
    h.pool.prepare()
    first = h.start("environment")
    seen = h.wait(first)[1]
    assert seen["pid"] == changed["pid"]  # the same process, not replaced
    assert "LEFT_BY_A_JOB" not in seen["env"]
    assert seen["cwd"] == os.getcwd()
    assert seen["env"]["LAKESHORE_INVOCATION_ID"] == first.id  # set while it runs
    assert seen["env"]["LAKESHORE_ATTEMPT"] == "1"
    again = h.ok("environment")
    assert again["pid"] == changed["pid"]
    assert again["env"]["LAKESHORE_INVOCATION_ID"] == str(int(first.id) + 1)  # each its own


def test_a_jobs_output_reaches_its_invocation_before_its_outcome(harness, capfd):
    h = harness()
    h.pool.prepare()
    item = h.start("say", "hello from the job")
    assert h.wait(item)[0] == "succeeded"
    assert h.lines(item, "o") == ["hello from the job"]
    assert h.printed_at_outcome[item.id] == 1  # there before the outcome was delivered
    assert "hello from the job" not in capfd.readouterr().out  # not the daemon's


def test_only_the_spawner_thread_starts_processes(harness):
    h = harness()
    errors = []

    def elsewhere():
        try:
            h.pool.prepare()
        except RuntimeError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert errors == ["job processes are started by the thread running Worker.run"]


def test_kill_stops_the_invocation_and_frees_the_slot(harness, tmp_path):
    h = harness()
    pidfile = tmp_path / "pid"
    h.pool.prepare()
    item = h.start("write_pid_then_sleep", str(pidfile), 300)
    old = int(_text(pidfile))
    assert h.pool.kill(item, wait=True)
    assert not alive(old)
    state, _, error = h.wait(item)
    assert state == "failed" and "exited with code -9" in error
    assert not h.pool.kill(item)  # no longer its process
    assert h.ok("pid") != old


def test_close_kills_idle_and_busy_processes(harness, tmp_path):
    h = harness(size=2)
    h.pool.prepare()
    idle_pids = set(h.pool.pids())
    pidfile = tmp_path / "pid"
    h.start("write_pid_then_sleep", str(pidfile), 300)
    busy = int(_text(pidfile))
    h.pool.close()
    assert all(gone(pid) for pid in idle_pids | {busy})


def test_an_idle_process_that_died_is_replaced_and_the_invocation_runs_elsewhere(harness):
    h = harness()
    for _ in range(3):  # each time the monitor may or may not have seen the death yet
        h.pool.prepare()
        (pid,) = h.pool.pids()
        os.kill(pid, signal.SIGKILL)
        assert gone(pid)
        state, result, error = h.wait(h.start("pid"))
        assert state == "succeeded", error
        assert result != pid


@pytest.mark.parametrize("isolation", ["pool", "process"])
def test_a_process_that_cannot_start_fails_the_invocation(harness, isolation):
    broken = {"PATH": os.environ["PATH"], "PYTHONHOME": "/nonexistent"}  # no stdlib
    h = harness(environment=lambda invocation: broken, isolation=isolation)
    for _ in range(2):
        state, _, error = h.run("pid")
        assert state == "failed"
        assert "exited" in error and "code 1" in error, error
