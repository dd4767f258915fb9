"""README "Providers" shows the whole Slurm loop as commands to type. Here they run as
printed, in order, against a live server whose controller ticks in a real Celery
worker with beat (as `make run` starts it), on a real Slurm cluster."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.models import Daemon
from jobs.models import Invocation
from tests.support import builders
from tests.support.servers import database_url
from tests.support.slurm import ours, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("slurm"),
    pytest.mark.slurm,
]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def readme_commands() -> list[str]:
    """The `lakeshore …` lines of the Providers section's example, comments cut off."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Providers") :]
    block = re.search(r"```bash\n(make slurm-up.*?)```", section, re.S)
    assert block, "README's Providers section has no example starting with make slurm-up"
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line.startswith("lakeshore ")]


def test_the_readme_example_works_as_printed(slurm_cluster, live_server, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.conf)  # the web server's shell, too
    commands = readme_commands()
    assert len(commands) >= 5, commands
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "lakeshore_admin.settings",
        "LAKESHORE_VAR_DIR": str(tmp_path / "var"),
        "LAKESHORE_PUBLIC_URL": live_server.url,
        "LAKESHORE_TICK_SECONDS": "1",
        "LAKESHORE_SCALE_DOWN_WINDOW": "0",
        "LAKESHORE_STARTUP_GRACE": "10",
        "LAKESHORE_BROKER_URL": "filesystem://",
        "SLURM_CONF": slurm_cluster.conf,  # "export SLURM_CONF=…" in the shell of make run
        "PYTHONWARNINGS": "ignore",
    }
    slurm_cluster.cancel_all()
    log = open(tmp_path / "celery.log", "w")  # noqa: SIM115 - lives as long as the worker
    worker = subprocess.Popen(
        [str(BIN / "celery"), "-A", "lakeshore_admin", "worker", "-B", "--pool=solo"]
        + ["--loglevel=info", f"--hostname=readme-{os.getpid()}@%h"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    cli_env = {
        **os.environ,
        "LAKESHORE_URL": live_server.url,
        "LAKESHORE_TOKEN": builders.token("operator"),
        "XDG_CONFIG_HOME": str(tmp_path),
    }

    def run(line: str) -> str:
        argv = shlex.split(line)
        done = subprocess.run(
            [str(BIN / "lakeshore"), *argv[1:]],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (line, done.stderr)
        return done.stdout

    try:
        for line in commands:
            if line.startswith("lakeshore providers show"):
                wait_for(
                    lambda: Daemon.objects.filter(state="idle").count() == 2,
                    timeout=60,
                    what="two daemons from Slurm jobs",
                )
                seen = []  # what the beat's tick last observed: its next tick sees both

                def both_running(seen=seen, line=line):
                    seen.append(run(line))
                    return len(re.findall(r"lakeshore-train-\d+\s+RUNNING", seen[-1])) == 2

                wait_for(both_running, timeout=60, what="the tick to observe both jobs")
                assert "Cluster: reachable" in seen[-1] and "Slurm jobs: 2" in seen[-1], seen[-1]
            elif line.startswith("lakeshore jobs list"):
                wait_for(
                    lambda: Invocation.objects.filter(state="succeeded").count() == 1,
                    what="the job",
                )
                listed = run(line)
                assert "succeeded" in listed, listed
            elif line.startswith("lakeshore queues patch train --min 0"):
                run(line)
                wait_for(
                    lambda: not ours(slurm_cluster, "train"),
                    timeout=60,
                    what="squeue to be empty after the scale-down",
                )
                assert set(Daemon.objects.values_list("state", flat=True)) == {"terminated"}
            else:
                run(line)
        assert Invocation.objects.get().result["args"] == ["on slurm"]
    finally:
        worker.terminate()
        worker.wait(30)
        slurm_cluster.cancel_all()
