"""Issue 17, "run only what is allowed": the daemon checks what a job's function
resolves to, not only the prefix of its dotted path.

The attack: an allowed module (`mymodule`, built in tmp_path) does `from os import
system`, so `mymodule.system` is `os.system`. Each attack's target would create a file;
a refused job fails with a clear error and the file is never made. Shown on a real
`lakeshore daemon run` against the live server, with each --isolation, for the CLI's
JSON jobs and the SDK's envelopes alike; the negative control runs the same jobs
through the real runner entry (a real subprocess, once and pooled) with the resolved
check switched off (the previous prefix rule), where every one of them runs."""

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from jobs import sdk, services
from jobs.models import Invocation
from tests.support import builders

dls = pytest.importorskip("dreamlake.lakeshore")
from dreamlake.lakeshore import wire  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.security]
live = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
LAKESHORE = str(Path(sys.executable).parent / "lakeshore")

MYMODULE = '''
from os import system  # the attack: os.system is now mymodule.system


def hello(path=""):
    """A plain function of mymodule's own: it runs."""
    if path:
        open(path, "w").write("hello")
    return "hello"


class Tool:
    @staticmethod
    def run(path):
        open(path, "w").write("Tool.run")


run = Tool.run  # a method re-exported under a plain name


def _private(path):
    open(path, "w").write("_private")
'''

# (function, the file it would make) — each must be refused and leave no file
ATTACKS = ("system", "run", "Tool.run", "_private")


@pytest.fixture
def pkg(tmp_path) -> Path:
    where = tmp_path / "pkg"
    where.mkdir()
    (where / "mymodule.py").write_text(textwrap.dedent(MYMODULE))
    return where


def _args(name: str, marker: Path) -> list:
    return [f"touch {marker}"] if name == "system" else [str(marker)]


def _envelope(qualname: str, args: list) -> bytes:
    fn = {"kind": "ref", "module": "mymodule", "qualname": qualname}
    return wire.Envelope(id=str(uuid.uuid4()), fn=fn, args=wire.pack(args)).to_bytes()


def _wait_for(condition, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    assert condition(), f"timed out after {timeout:.0f} s waiting for {what}"


# ---------------------------------------------------------------------------- a real daemon


@pytest.fixture(params=["pool", "process"])
def isolation(request) -> str:
    return request.param


@pytest.fixture
def daemon(live_server, tmp_path, pkg, isolation):
    """A `lakeshore daemon run` on queue "sec" with mymodule on its PYTHONPATH and
    LAKESHORE_ALLOWED_MODULES=mymodule; killed at the end if still running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKESHORE_", "DJANGO_"))}
    env.pop("DATABASE_URL", None)
    env |= {
        "LAKESHORE_URL": live_server.url,
        "LAKESHORE_TOKEN": builders.token("daemon"),
        "LAKESHORE_ALLOWED_MODULES": "mymodule",
        "XDG_CONFIG_HOME": str(tmp_path),
        "PYTHONPATH": os.pathsep.join((str(ROOT), str(pkg))),
    }
    log = open(tmp_path / "daemon.log", "w")  # noqa: SIM115 - closed below
    command = [LAKESHORE, "daemon", "run", "--queues", "sec", "--heartbeat", "1"]
    proc = subprocess.Popen(
        [*command, "--isolation", isolation],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    log.close()


@live
def test_a_daemon_refuses_what_an_allowed_module_imports_and_runs_its_own_functions(
    tmp_path, daemon
):
    builders.queue(name="sec")
    made = tmp_path / "made"
    made.mkdir()
    jobs = {}
    for name in ATTACKS:
        marker = made / f"json-{name}"
        # the server refuses '_' parts at submit; this row stands for one that got past it
        inv, _ = services.invocation_submit(
            function="mymodule.hello", queue="sec", args=_args(name, marker)
        )
        Invocation.objects.filter(pk=inv.pk).update(function=f"mymodule.{name}")
        jobs[f"json {name}"] = (inv, marker)
        marker = made / f"sdk-{name}"
        inv, _ = sdk.submit({"queue": "sec", "args_blob": _envelope(name, _args(name, marker))})
        jobs[f"sdk {name}"] = (inv, marker)
    ok_json, _ = services.invocation_submit(
        function="mymodule.hello", queue="sec", args=[str(made / "json-hello")]
    )
    ok_sdk, _ = sdk.submit({"queue": "sec", "args_blob": _envelope("hello", [str(made / "sdk")])})

    everything = [inv for inv, _ in jobs.values()] + [ok_json, ok_sdk]
    ended = ("succeeded", "failed", "timeout", "killed")

    def all_ended():
        states = Invocation.objects.filter(pk__in=[i.pk for i in everything])
        return all(s in ended for s in states.values_list("state", flat=True))

    _wait_for(all_ended, what="every job to end")
    assert daemon.poll() is None  # the daemon itself is fine

    for label, (inv, marker) in jobs.items():
        inv.refresh_from_db()
        assert inv.state == "failed", label
        assert "refused" in inv.error or "not in an allowed module" in inv.error, (label, inv.error)
        assert not marker.exists(), f"{label} ran"
    for wire_name in ("json", "sdk"):
        error = Invocation.objects.get(pk=jobs[f"{wire_name} system"][0].pk).error
        # the function, its real module and the allowed modules are named
        assert "'mymodule.system'" in error and "posix.system" in error, error
        assert "this daemon runs lakeshore.functions, mymodule" in error, error
    assert Invocation.objects.get(pk=jobs["sdk system"][0].pk).attempts == 1  # final
    for inv in (ok_json, ok_sdk):
        inv.refresh_from_db()
        assert inv.state == "succeeded", inv.error
    assert (made / "json-hello").read_text() == "hello"
    assert (made / "sdk").read_text() == "hello"


# ---------------------------------------------------------------------------- the runner entry

GUARD_OFF = """
import sys
from lakeshore import allow, runner, sdk_job

# the previous rule: the requested module's prefix, nothing about what it resolves to
runner.name_refusal = sdk_job.name_refusal = lambda module, name, allowed: (
    None if allow.in_allowed(module, allowed) else "not in an allowed module"
)
runner.target_refusal = lambda *args: None
sdk_job.entry_command = lambda allowed: [sys.executable, "-m", sdk_job.ENTRY]
"""
GUARD_ON = "import sys\nfrom lakeshore import runner\n"


def _run_in_runner(pkg: Path, messages: list[dict], *, once: bool, guard: bool) -> list[dict]:
    """Runs `messages` through `lakeshore.runner`'s entry in a real subprocess (one
    process with `once`, else one pooled process for all), as lakeshore.pool does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKESHORE_", "DJANGO_"))}
    env["PYTHONPATH"] = os.pathsep.join((str(ROOT), str(pkg)))
    outcomes = []
    batches = [[m] for m in messages] if once else [messages]
    for batch in batches:
        to_job, from_us = os.pipe()
        to_us, from_job = os.pipe()
        prelude = (GUARD_ON if guard else GUARD_OFF) + "runner.main(sys.argv[1:])\n"
        argv = ["--in", str(to_job), "--out", str(from_job), *(["--once"] if once else [])]
        proc = subprocess.Popen(
            [sys.executable, "-c", prelude, *argv],
            env=env,
            cwd=pkg.parent,
            pass_fds=(to_job, from_job),
        )
        os.close(to_job)
        os.close(from_job)
        with os.fdopen(from_us, "wb") as writer:
            writer.write(b"".join(json.dumps(m).encode() + b"\n" for m in batch))
        with os.fdopen(to_us, "rb") as reader:
            outcomes.extend(json.loads(line) for line in reader)
        assert proc.wait(60) == 0
    return outcomes


@pytest.mark.parametrize("once", [True, False], ids=["process", "pool"])
@pytest.mark.parametrize("guard", [True, False], ids=["guarded", "previous-rule"])
def test_the_runner_entry_refuses_them_and_the_previous_rule_ran_them(tmp_path, pkg, once, guard):
    messages, markers = [], []
    for n, name in enumerate(ATTACKS):
        marker = tmp_path / f"json-{name}"
        messages.append(
            {"id": n, "function": f"mymodule.{name}", "args": _args(name, marker)}
            | {"allowed_modules": ["mymodule"]}
        )
        markers.append(marker)
        marker = tmp_path / f"sdk-{name}"
        blob = base64.b64encode(_envelope(name, _args(name, marker))).decode()
        messages.append(
            {"id": 10 + n, "function": f"mymodule.{name}", "wire": "envelope"}
            | {"args_blob": blob, "allowed_modules": ["mymodule"], "allow_pickled": False}
        )
        markers.append(marker)
    outcomes = _run_in_runner(pkg, messages, once=once, guard=guard)
    by_id = {o["id"]: o for o in outcomes}
    assert len(by_id) == len(messages)
    if guard:
        assert [m for m in markers if m.exists()] == []  # nothing ran
        assert not any(o["ok"] for o in outcomes)
        assert all("refused" in o["error"] for o in outcomes), outcomes
    else:
        # JSON Tool.run does not import as a module either way: every other one ran
        ran = [m.name for m in markers if m.exists()]
        assert sorted(ran) == sorted(
            ["json-system", "json-run", "json-_private"]
            + ["sdk-system", "sdk-run", "sdk-Tool.run", "sdk-_private"]
        )
