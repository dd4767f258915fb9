"""The README's "Using it" block, read from README.md (so the two cannot drift apart) and
run line by line, as printed, with the real `lakeshore` command against what `make run`
starts: gunicorn, a Celery worker with beat, the `local` provider's daemons, and the
daemons the block itself starts in the background. Every command exits 0, and every job
the block submits reaches its end: none stays queued for want of a daemon."""

import inspect
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.models import Invocation
from lakeshore import functions
from tests.support import builders, stack
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SUBMITTED = re.compile(r"^job/(\d+) queued in ", re.MULTILINE)
# `JOB=$(lakeshore jobs submit … --json | jq -r .id)`: a shell variable the next lines use
ASSIGNED = re.compile(r"^([A-Z_]+)=\$\((.*)\)$")


def using_it() -> list[str]:
    """The command lines of the first bash block under '## Using it'."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_block_is_what_this_test_expects():
    lines = using_it()
    assert any(line.endswith("&") for line in lines)  # it starts daemons of its own
    assert any(ASSIGNED.match(line) for line in lines)
    assert not any(re.search(r"jobs (logs|show) \d", line) for line in lines)  # no literal id
    assert any("jobs submit" in line and "--queue" not in line for line in lines)


def test_the_readmes_using_it_block_runs_end_to_end(tmp_path):
    token = builders.token("operator")
    background: list[subprocess.Popen] = []
    submitted: list[str] = []
    with stack.running(tmp_path, tick_seconds=5) as (base, _):
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAKESHORE_")}
        env.update(
            LAKESHORE_URL=base,
            LAKESHORE_TOKEN=token,
            XDG_CONFIG_HOME=str(tmp_path / "config"),
            PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            COLUMNS="200",
        )
        try:
            for line in using_it():
                command = line.split(" #", 1)[0].rstrip()
                if command.endswith("&"):  # a daemon, in the background as printed
                    log = open(tmp_path / f"background-{len(background)}.log", "w")  # noqa: SIM115
                    background.append(
                        subprocess.Popen(
                            ["bash", "-c", command[:-1]],
                            env=env,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
                    continue
                assigned = ASSIGNED.match(command)
                if assigned:  # the shell keeps the variable for the lines below
                    command = assigned.group(2)
                done = subprocess.run(
                    ["bash", "-o", "pipefail", "-c", command],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=90,
                )
                assert done.returncode == 0, (
                    f"{command!r} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
                )
                assert "Traceback" not in done.stderr, done.stderr
                # a submit right after `daemon run &` says nothing of a missing daemon
                assert "No live daemon" not in done.stderr, (command, done.stderr)
                if assigned:
                    env[assigned.group(1)] = done.stdout.strip()
                    submitted.append(done.stdout.strip())
                submitted += SUBMITTED.findall(done.stdout)

            assert len(submitted) >= 4
            wait_for(
                lambda: all(
                    state == "succeeded"
                    for state in Invocation.objects.filter(pk__in=submitted).values_list(
                        "state", flat=True
                    )
                ),
                timeout=90,
                what="every job the README submits to succeed",
            )
        finally:
            for proc in background:  # Ctrl-C: finish, deregister, stop
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGINT)
            for proc in background:
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)
    jobs = Invocation.objects.filter(pk__in=submitted)
    assert sorted(jobs.values_list("queue", flat=True)) == ["", "elastic", "gpu", "gpu"]
    assert set(jobs.values_list("state", flat=True)) == {"succeeded"}


def test_the_readme_names_every_function_daemons_always_run():
    """`lakeshore.functions`, as the README lists them, is what the module holds."""
    text = (ROOT / "README.md").read_text()
    listed = re.search(r"functions of `lakeshore\.functions` \(([^)]*)\)", text).group(1)
    names = {name.strip(" `") for name in listed.split(",")}
    public = {
        name
        for name, value in inspect.getmembers(functions, inspect.isfunction)
        if value.__module__ == functions.__name__ and not name.startswith("_")
    }
    assert names == public
