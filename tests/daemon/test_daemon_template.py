"""`lakeshore daemon run --isolation process` forks each job from a warm template
(lakeshore.pool.forkserver), against the live server: the template never holds the
daemon's token (not in its environment, not in its memory), a killed job's whole
process group dies, and a template killed under a running daemon is started again while
the daemon carries on. The job functions are in tests/daemon/jobfuncs.py and poolfuncs.py."""

import os
import re
import signal
import time
from pathlib import Path

import pytest

from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from tests.daemon.jobfuncs import alive
from tests.daemon.test_daemon_exec import _exec
from tests.daemon.test_daemon_faults import (
    FUNCS,
    GONE_WITHIN,
    _gone_within,
    _kill_quietly,
    _log,
    _state,
    _stop,
    _text,
    _wait_for,
)
from tests.daemon.test_template import memory_holds
from tests.support import builders

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.parametrize("isolation", ["process"]),
]

POOLFUNCS = "tests.daemon.poolfuncs"
ALLOWED = f"{FUNCS},{POOLFUNCS}"


def _template(tmp_path, name: str, after: int = 0) -> int:
    """The pid of the daemon's job template, from its log (the (after+1)th it started)."""
    found: list[int] = []

    def ready() -> bool:
        found[:] = [int(p) for p in re.findall(r"job template (\d+) ready", _log(tmp_path, name))]
        return len(found) > after

    _wait_for(ready, what="the job template")
    return found[after]


def _ok(function: str, *args):
    inv, _ = services.invocation_submit(function=function, queue="e2e", args=list(args))
    _wait_for(lambda: _state(inv) not in ("queued", "running"), what=f"{function}'s end")
    inv.refresh_from_db()
    assert inv.state == "succeeded", inv.error
    return inv.result


def test_a_job_cannot_read_the_daemons_token_from_the_template(daemons, tmp_path):
    builders.queue(name="e2e")
    token = builders.token("daemon")
    proc = daemons("d", LAKESHORE_TOKEN=token, LAKESHORE_ALLOWED_MODULES=ALLOWED)
    me = _ok(f"{POOLFUNCS}.whoami")
    template = _template(tmp_path, "d")
    assert me["ppid"] == proc.pid  # the daemon's child, as a job process always was
    assert token not in str(me["env"])
    environ = _ok(f"{POOLFUNCS}.read_environ", template)
    assert any(e.startswith("PATH=") for e in environ)  # it did read it
    assert not [e for e in environ if token in e or e.startswith("LAKESHORE_")]
    assert not memory_holds(template, token.encode())
    assert memory_holds(proc.pid, token.encode())  # the control: the daemon holds it
    assert _stop(proc, "d") == 0, _log(tmp_path, "d")
    assert not alive(template)  # the template ends with its daemon


def test_a_killed_job_dies_with_its_whole_process_group(daemons, live_server, tmp_path):
    """`lakeshore daemon exec D kill JOB` (how a running job is cancelled)."""
    builders.queue(name="e2e")
    ledger = tmp_path / "ledger"
    inv, _ = services.invocation_submit(
        function=f"{FUNCS}.with_grandchild", queue="e2e", args=[str(ledger), 300]
    )
    proc = daemons("d")
    grandchild = None
    try:
        _wait_for(lambda: "grandchild" in _text(ledger), what="the grandchild's start")
        grandchild = int(_text(ledger).split("grandchild ")[1].split()[0])
        stat = Path(f"/proc/{grandchild}/stat").read_text()
        job = int(stat.rsplit(")", 1)[1].split()[2])  # its process group: the job's pid
        assert alive(job) and job != proc.pid
        cancelled = time.monotonic()
        out = _exec(live_server, tmp_path, str(Daemon.objects.get().pk), "kill", str(inv.pk))
        assert out.returncode == 0, out.stderr
        # the daemon learns it at its next heartbeat (1 s), then kills the group
        _gone_within(grandchild, cancelled + 1.5, f"grandchild {grandchild} to die")
        _gone_within(job, cancelled + 1.5, f"job process {job} to die")
        assert _state(inv) == "killed"
        assert proc.poll() is None  # the daemon carries on
        assert _stop(proc, "d") == 0, _log(tmp_path, "d")
    finally:
        if grandchild is not None:
            _kill_quietly(grandchild)


def test_a_killed_template_is_started_again_and_jobs_go_on(daemons, tmp_path):
    builders.queue(name="e2e")
    proc = daemons("d")
    first = _template(tmp_path, "d")
    os.kill(first, signal.SIGKILL)
    _wait_for(lambda: not alive(first), timeout=GONE_WITHIN, what="the template to die")
    results = [_ok("lakeshore.functions.echo", n) for n in range(3)]
    assert [r["args"] for r in results] == [[0], [1], [2]]
    second = _template(tmp_path, "d", after=1)
    assert second != first and alive(second)
    assert f"job template {first} exited (code -9)" in _log(tmp_path, "d")
    assert Invocation.objects.exclude(state="succeeded").count() == 0
    assert _stop(proc, "d") == 0, _log(tmp_path, "d")
