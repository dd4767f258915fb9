"""`--isolation process` forks each job process from a warm template (lakeshore.pool.template,
lakeshore.pool.forkserver): real template and job processes, a Pool started from this
test's thread (the spawner), no server. Each job process is fresh: it sees nothing a job
before it left, nothing of the template but the modules it preloaded, and no token; it
is this process's child, leads a session of its own, and outlives a template that dies,
which is started again."""

import os
import signal
import threading
import time

from lakeshore.pool.forkserver import top_level_imports
from lakeshore.pool.template import Template
from lakeshore.worker.environment import job_environment
from tests.daemon.jobfuncs import alive
from tests.daemon.test_pool import ROOT, gone, harness  # noqa: F401 - the fixture

TOKEN = "lsk_template_test_0123456789abcdef"  # stands for the daemon's token


def _process(harness, **options):  # noqa: F811
    h = harness(isolation="process", **options)
    h.logged = []
    h.pool.log = h.logged.append
    return h


def memory_holds(pid: int, needle: bytes) -> bool:
    """Whether `needle` is anywhere in the readable memory of process `pid`."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r") or "[vvar" in line or "[vsyscall" in line:
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except (OSError, ValueError, OverflowError):
                continue
    return False


def test_a_job_sees_nothing_the_job_before_it_left(harness):  # noqa: F811
    h = _process(harness)
    left = h.ok("leave_state", "here")
    assert left == {"pid": left["pid"], "global": "here", "env": "here", "module": "here"}
    seen = h.ok("seen_state")
    assert seen == {"pid": seen["pid"], "global": None, "env": None, "module": None}
    assert seen["pid"] != left["pid"]
    assert "subprocess" in h.pool.template.preloaded  # the module shared with the template
    assert h.pool.template.starts == 1  # both were forked from the same template


def test_control_a_pool_process_keeps_what_the_job_before_it_left(harness):  # noqa: F811
    """The same two jobs in one warm pool process: the global and the preloaded module's
    attribute survive (the environment is put back between invocations)."""
    h = harness(isolation="pool")
    left = h.ok("leave_state", "here")
    seen = h.ok("seen_state")
    assert seen == {"pid": left["pid"], "global": "here", "env": None, "module": "here"}


def test_a_job_is_this_processs_child_and_holds_nothing_of_the_template(harness):  # noqa: F811
    h = _process(harness)
    me = h.ok("whoami")
    template = h.pool.template.pid
    assert me["ppid"] == os.getpid() != template  # the daemon's child, as without it
    assert me["sid"] == me["pgid"] == me["pid"]  # a session and process group of its own
    assert me["env"] == job_environment(
        {**os.environ, "PYTHONPATH": str(ROOT)},
        [],
        {"id": me["env"]["LAKESHORE_INVOCATION_ID"], "attempts": 1},
    )
    assert "--control" not in me["argv"] and me["argv"][-1] == "--once"
    # stdin, stdout, stderr, the runner's two pipes and the listing's own descriptor
    assert len(me["fds"]) == 6 and me["fds"][:3] == [0, 1, 2], me["fds"]
    sockets = [
        fd
        for fd in os.listdir(f"/proc/{template}/fd")
        if os.readlink(f"/proc/{template}/fd/{fd}").startswith("socket:")
    ]
    assert sockets  # the control: the template's own socket is there to be seen


def test_the_template_never_holds_the_daemons_token(harness):  # noqa: F811
    source = {**os.environ, "PYTHONPATH": str(ROOT), "LAKESHORE_TOKEN": TOKEN}
    h = _process(harness, environment=lambda invocation: job_environment(source, [], invocation))
    me = h.ok("whoami")
    template = h.pool.template.pid
    assert TOKEN not in str(me["env"])
    environ = h.ok("read_environ", template)  # what a job can read of it
    assert environ and not [entry for entry in environ if TOKEN in entry]
    assert not memory_holds(template, TOKEN.encode())
    assert memory_holds(os.getpid(), TOKEN.encode())  # the control: the scan finds it here


def test_a_job_outlives_a_killed_template_which_is_started_again(harness, tmp_path):  # noqa: F811
    h = _process(harness)
    h.pool.prepare()
    first = h.pool.template.pid
    pidfile = tmp_path / "pid"
    item = h.start("write_pid_then_sleep", str(pidfile), 1.0)
    while not pidfile.exists() or not pidfile.read_text():
        time.sleep(0.01)
    os.kill(first, signal.SIGKILL)
    state, result, error = h.wait(item)
    assert (state, result) == ("succeeded", int(pidfile.read_text())), error
    after = h.ok("pid")
    assert h.pool.template.pid != first and h.pool.template.starts == 2
    assert alive(h.pool.template.pid) and not alive(after)
    assert f"job template {first} exited (code -9); starting another" in h.logged


def test_a_template_that_dies_while_forking_is_replaced_and_the_job_runs(harness):  # noqa: F811
    h = _process(harness)
    h.pool.prepare()
    first = h.pool.template.pid
    os.kill(first, signal.SIGSTOP)  # it takes the request but cannot fork
    threading.Timer(0.3, os.kill, (first, signal.SIGKILL)).start()
    state, result, error = h.wait(h.start("pid"))
    assert state == "succeeded", error
    assert h.pool.template.pid != first
    assert (
        f"job template {first} exited (code -9) while forking a job process; starting another"
        in h.logged
    )


def test_a_template_that_cannot_start_leaves_a_fresh_interpreter_per_job(harness):  # noqa: F811
    broken = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "PYTHONHOME": "/nonexistent"}
    h = _process(harness, environment=lambda invocation: broken)
    h.pool.prepare()
    assert h.pool.template_failed
    assert any("each job process is a fresh interpreter" in line for line in h.logged)


def test_a_jobs_exit_functions_run_as_its_process_ends(harness, tmp_path):  # noqa: F811
    h = _process(harness)
    pid = h.ok("at_exit_writes", str(tmp_path / "ran"), "at exit")
    assert (tmp_path / "ran").read_text() == "at exit"  # before its invocation ended
    assert not alive(pid)


def test_what_the_allowed_modules_import_is_preloaded_but_not_they_themselves(harness):  # noqa: F811
    source = """
import os, sys
from a.b import c
try:
    import d
except ImportError:
    e = 1
if x:
    import f
def g():
    import h
"""
    assert top_level_imports(source) == ["os", "sys", "a.b", "d", "f"]
    h = _process(harness)
    h.pool.prepare()
    preloaded = h.pool.template.preloaded
    assert {"logging", "subprocess", "lakeshore.functions"} <= set(preloaded)
    assert "tests.daemon.poolfuncs" not in preloaded  # the user's module: its state is theirs


def test_a_library_whose_import_starts_a_thread_is_left_out(tmp_path):
    """A process with threads cannot be forked safely: the template starts over without
    such a module; one that does not import is left to the job."""
    (tmp_path / "threadmod.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    (tmp_path / "userjobs.py").write_text("import json\nimport threadmod\nimport no_such_mod\n")
    env = job_environment({**os.environ, "PYTHONPATH": f"{ROOT}:{tmp_path}"}, [], None)
    logged: list[str] = []
    template = Template(env, preload=("userjobs",), log=logged.append)
    try:
        template.start()
        assert "json" in template.preloaded and "threadmod" not in template.preloaded
        assert "userjobs" not in template.preloaded
        assert "threadmod (its import starts a thread)" in logged[0], logged
        assert "no_such_mod (ModuleNotFoundError" in logged[0], logged
        assert len(os.listdir(f"/proc/{template.pid}/task")) == 1  # it can fork
    finally:
        template.stop()


def test_jobs_about_to_start_get_processes_forked_ahead_each_used_once(harness):  # noqa: F811
    """The spawner forks the processes of the jobs it is about to start in one exchange
    with the template (Pool.fork_ahead); each job then takes one that ran nothing, sees
    its own invocation's id, and the process ends with it: a job never gets a process
    another job ran in."""
    h = _process(harness, size=3)
    h.pool.prepare()
    h.pool.fork_ahead(3)
    ahead = {p.pid for p in h.pool.processes}
    assert len(ahead) == 3 and h.pool.template.starts == 1
    items = [h.start("environment") for _ in range(3)]
    seen = []
    for item in items:
        state, result, error = h.wait(item)
        assert state == "succeeded", error
        assert result["env"]["LAKESHORE_INVOCATION_ID"] == item.id
        seen.append(result["pid"])
    assert set(seen) == ahead  # each job took a process forked ahead, one each
    assert all(gone(pid) for pid in seen)  # and it ended with its job
    after = h.ok("pid")
    assert after not in ahead


def test_control_without_forking_ahead_each_job_forks_its_own_process(harness):  # noqa: F811
    """The negative control: no process waits before the jobs start, and each still gets
    a fresh one. In pool isolation forking ahead adds nothing (a pool process runs one
    invocation after another)."""
    h = _process(harness, size=3)
    h.pool.prepare()
    assert h.pool.processes == []
    pids = [h.ok("pid") for _ in range(3)]
    assert len(set(pids)) == 3
    pooled = harness(size=2)
    pooled.pool.fork_ahead(2)
    assert pooled.pool.processes == []


def test_a_template_that_stops_answering_mid_batch_is_replaced_and_every_job_runs(harness):  # noqa: F811
    """A batch of fork requests sent to a template that then dies without answering: no
    process was made for any, each is asked again of a new template, and every job runs
    in a process of its own."""
    h = _process(harness, size=3)
    h.pool.prepare()
    first = h.pool.template.pid
    os.kill(first, signal.SIGSTOP)  # it takes the requests but cannot fork
    threading.Timer(0.3, os.kill, (first, signal.SIGKILL)).start()
    h.pool.fork_ahead(3)
    assert h.pool.template.pid != first and h.pool.template.starts == 2
    ahead = {p.pid for p in h.pool.processes}
    assert len(ahead) == 3
    results = [h.wait(h.start("pid")) for _ in range(3)]
    assert all(state == "succeeded" for state, _, _ in results), results
    assert {pid for _, pid, _ in results} == ahead
    assert (
        f"job template {first} exited (code -9) while forking a job process; starting another"
        in h.logged
    )
