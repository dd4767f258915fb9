"""Processes the SDK tests start: the SDK's own worker, or `lakeshore daemon run`."""

import os
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # where tests.support.sdk_udfs imports from


@pytest.fixture
def processes(tmp_path):
    """start(command, env=…, cwd=…) → Popen, with the server's settings left out of its
    environment and its output in tmp_path/<name>-N.log; every process (and its group)
    still running at the end is killed."""
    started = []

    def start(command: list[str], *, name: str, env: dict, cwd: Path = ROOT):
        full = {**os.environ, **env}
        for secret in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE"):
            full.pop(secret, None)
        log = open(tmp_path / f"{name}-{len(started)}.log", "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            command, cwd=cwd, env=full, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        started.append((proc, log))
        return proc

    yield start
    for proc, log in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
