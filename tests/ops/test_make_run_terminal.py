"""What `make run`'s terminal shows (issue 33): its banner, warnings, errors and what
starts and stops, not a line per request. The access log goes to var/log/access.log
(the banner says where; LAKESHORE_ACCESS_LOG=- brings it back), and the first start's
admin login and token stay reachable in var/credentials (0600; `make credentials`).
An idle SDK worker polling the whole time adds no line to the terminal."""

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.ops.harness import ROOT, MakeRun, clean_start

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("make-run")]

# The SDK's worker polls every 2 s: about ten requests in the 20 s `make test` waits.
# The five minutes, which take in the beat's retention run, once by hand:
# LAKESHORE_TEST_IDLE_SECONDS=300 pytest tests/ops/test_make_run_terminal.py
IDLE_SECONDS = float(os.environ.get("LAKESHORE_TEST_IDLE_SECONDS", "20"))


@pytest.fixture
def run(tmp_path):
    run = MakeRun(tmp_path)
    try:
        yield run
    finally:
        run.clean_up()


def test_the_terminal_stays_quiet_and_the_credentials_stay_reachable(run, tmp_path):
    first = run.start()
    assert not clean_start(first), first
    credentials = run.var / "credentials"
    assert f"(both kept in {credentials}, mode 0600: 'make credentials' prints them)" in first
    access = run.var / "log" / "access.log"
    assert f"  access log: {access} (LAKESHORE_ACCESS_LOG=- shows it here)" in first
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    kept = credentials.read_text()
    token = next(line for line in kept.splitlines() if line.startswith("API token")).split()[-1]
    assert token == run.token() and "admin login: admin / " in kept
    answer = httpx.get(
        f"{run.url}/api/v1/queues/", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert answer.status_code == 200
    printed = subprocess.run(
        ["make", "-s", "credentials"],
        cwd=ROOT,
        env={**run.env, "LAKESHORE_VAR_DIR": str(run.var)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.stdout == kept

    assert run.cli("queues", "add", "gpu").returncode == 0
    lines_before = len(run.output().splitlines())
    worker_log = tmp_path / "sdk-worker.log"
    with open(worker_log, "w") as out:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dreamlake.lakeshore.daemon",
                "--url",
                run.url,
                "--queue",
                "gpu",
            ],
            env={
                **run.env,
                "LAKESHORE_HOME": str(tmp_path / "sdk"),
                "LAKESHORE_CLIENT_TOKEN": token,
            },
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        time.sleep(IDLE_SECONDS)
        assert worker.poll() is None, worker_log.read_text()
    finally:
        worker.terminate()
        worker.wait(30)
    added = run.output().splitlines()[lines_before:]
    assert added == [], added  # not a line per poll
    polls = [line for line in access.read_text().splitlines() if "/v1/daemon/poll" in line]
    assert len(polls) >= 3  # the control: the polls happened, and were logged there

    run.ctrl_c()
    run.front.wait(60)
    again = run.start()
    assert "(password: 'make credentials' prints it;" in again


def test_the_access_log_comes_back_to_the_terminal_when_asked(tmp_path):
    run = MakeRun(tmp_path, LAKESHORE_ACCESS_LOG="-")
    try:
        text = run.start()
        assert "  access log: here (LAKESHORE_ACCESS_LOG=-)" in text
        httpx.get(f"{run.url}/healthz", timeout=10)
        deadline = time.monotonic() + 10
        while "GET /healthz" not in run.output() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "GET /healthz" in run.output()
        assert not (Path(run.env["LAKESHORE_VAR_DIR"]) / "log" / "access.log").exists()
    finally:
        run.clean_up()
