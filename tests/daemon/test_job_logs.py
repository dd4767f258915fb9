"""Per-job logs end to end: a real `lakeshore daemon run` (both isolations) captures
what its jobs print and ships it to the live server, where `lakeshore jobs logs` and
the API read it, live, after a crash, a kill -9 and a flood."""

import os
import signal
import subprocess

import pytest
from rest_framework.test import APIClient

from jobs import services
from jobs.models import Invocation, JobLog
from tests.daemon.test_daemon_pool import (  # noqa: F401 - daemon: the fixture
    FUNCS,
    LAKESHORE,
    _wait_for,
    daemon,
)
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ISOLATIONS = ["pool", "process"]


def submit(function: str, *args, **fields) -> int:
    inv, _ = services.invocation_submit(
        function=f"{FUNCS}.{function}", queue="e2e", args=list(args), **fields
    )
    return inv.pk


def state(pk: int) -> str:
    return Invocation.objects.values_list("state", flat=True).get(pk=pk)


def wait_ended(pk: int, timeout: float = 60) -> str:
    _wait_for(lambda: state(pk) not in ("queued", "running"), timeout=timeout, what="its end")
    return state(pk)


def read_all(pk: int) -> list[dict]:
    viewer = APIClient()
    viewer.credentials(**builders.auth(builders.token("viewer")))
    lines, offset = [], 0
    while True:
        page = viewer.get(f"/api/v1/jobs/{pk}/logs/", {"offset": offset}).json()
        lines += page["lines"]
        if page["next_offset"] >= page["total_lines"] or not page["lines"]:
            return lines
        offset = page["next_offset"]


def texts(lines: list[dict], stream: str) -> list[str]:
    return [line["text"] for line in lines if line["stream"] == stream]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_thousand_lines_each_way_a_crash_and_a_kill(daemon, isolation, tmp_path):  # noqa: F811
    daemon("--isolation", isolation, "--concurrency", "2")
    chatty = submit("chatter", 1000)
    crash = submit("crash")
    marker = tmp_path / "victim"
    victim = submit("print_then_die", str(marker))
    assert wait_ended(chatty) == "succeeded"
    got = read_all(chatty)
    assert texts(got, "out") == [f"out {i}" for i in range(1000)]
    assert texts(got, "err") == [f"err {i}" for i in range(1000)]

    assert wait_ended(crash) == "failed"
    err = texts(read_all(crash), "err")
    assert "Traceback (most recent call last):" in err
    assert err[-1] == "RuntimeError: crashed on purpose"

    _wait_for(lambda: marker.exists() and marker.read_text(), what="the victim's start")
    os.kill(int(marker.read_text()), signal.SIGKILL)
    assert wait_ended(victim) == "failed"
    assert texts(read_all(victim), "out") == ["before the kill", "an unended line"]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_jobs_logs_follow_prints_lines_while_the_job_runs(daemon, isolation, live_server, tmp_path):  # noqa: F811
    daemon("--isolation", isolation)
    pk = submit("ticker", 15, 0.2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKESHORE_")}
    env |= {"LAKESHORE_URL": live_server.url, "LAKESHORE_TOKEN": builders.token("viewer")}
    with open(tmp_path / "follower.err", "w") as err:
        follower = subprocess.Popen(
            [LAKESHORE, "jobs", "logs", str(pk), "--follow"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    first = follower.stdout.readline()
    assert first == "tick 0\n", (tmp_path / "follower.err").read_text()
    assert state(pk) == "running", "the first line came only after the job ended"
    rest = follower.stdout.read()  # through the same buffer readline filled
    assert follower.wait(60) == 0, (tmp_path / "follower.err").read_text()
    assert (first + rest).splitlines() == [f"tick {i}" for i in range(15)]


def test_a_200_mib_printer_is_capped_with_its_marker(daemon, settings):  # noqa: F811
    settings.LAKESHORE_LOG_MAX_BYTES = 1024 * 1024  # the live server reads it per chunk
    daemon("--isolation", "pool")
    pk = submit("flood", 200)
    assert wait_ended(pk, timeout=180) == "succeeded"
    got = read_all(pk)
    out = [line for line in got if line["stream"] == "out"]
    cut = [line for line in got if line["stream"] == "cut"]
    assert len(cut) == 1 and "LAKESHORE_LOG_MAX_BYTES" in cut[0]["text"]
    assert out[0]["text"].startswith("0000000000 ")  # the head
    last = 200 * 1024 * 1024 // 8192 - 1
    assert out[-1]["text"].startswith(f"{last:010d} ")  # the tail, to the last line
    log = JobLog.objects.get(invocation_id=pk)
    assert log.head_bytes + log.tail_bytes <= 1024 * 1024
    assert log.cut_lines > 0 and log.lines + log.dropped_lines == last + 1
