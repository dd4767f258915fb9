"""`lakeshore jobs logs` against a live server: the installed command, in a shell, reading
what a registered daemon shipped through the API."""

import threading
import time

import pytest

from tests.support.job_logs import lines, running_job, ship

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running(live_server):
    return running_job()


def test_it_prints_what_the_job_printed(sh, running):
    job, me, daemon = running
    ship(daemon, me, job, [["o", time.time(), "hello"], ["e", time.time(), "Traceback (most"]])
    ship(daemon, me, job, lines(3), seq=1)
    out = sh(f"lakeshore jobs logs {job}").stdout
    assert out == "hello\nTraceback (most\nline 0\nline 1\nline 2\n"
    assert sh(f"lakeshore jobs logs {job} --tail 2").stdout == "line 1\nline 2\n"
    assert sh(f"lakeshore jobs logs {job} --stream err").stdout == "Traceback (most\n"
    assert sh(f"lakeshore jobs logs {job} --since 10m").stdout.count("\n") == 5
    assert sh(f"lakeshore jobs logs {job} --attempt 1 --json").stdout.count('"stream"') == 5


def test_it_reads_every_page(sh, running):
    job, me, daemon = running
    for seq in range(3):
        ship(daemon, me, job, lines(1000, start=seq * 1000), seq=seq)
    out = sh(f"lakeshore jobs logs {job}").stdout.splitlines()
    assert out == [f"line {i}" for i in range(3000)]


@pytest.mark.parametrize("state,code", [("succeeded", 0), ("failed", 1)])
def test_follow_prints_lines_as_they_come_and_exits_with_the_jobs_state(sh, running, state, code):
    job, me, daemon = running
    ship(daemon, me, job, lines(1))

    def later():
        time.sleep(1.5)
        ship(daemon, me, job, lines(1, start=1), seq=1)
        time.sleep(0.5)
        daemon.post(
            f"/api/v1/daemons/{me}/complete/",
            {"invocation": job, "attempt": 1, "state": state, "retry": False},
            format="json",
        )

    writer = threading.Thread(target=later)
    writer.start()
    result = sh(f"lakeshore jobs logs {job} --follow", exit=code)
    writer.join()
    assert result.stdout == "line 0\nline 1\n"


def test_follow_of_a_job_killed_while_queued_exits_2(sh, operator_token, live_server):
    queue = "logs-killed"
    sh(f"lakeshore queues add {queue}")
    job = sh.json(f"lakeshore jobs submit lakeshore.functions.echo --queue {queue} --json")["id"]
    sh(f"lakeshore jobs kill {job}")
    assert sh(f"lakeshore jobs logs {job} --follow", exit=2).stdout == ""


def test_bad_input_gets_a_clear_error(sh, running):
    job, _, _ = running
    bad = sh(f"lakeshore jobs logs {job} --since yesterday", exit=2)
    assert "neither a time" in bad.stderr
    missing = sh(f"lakeshore jobs logs {job} --attempt 9", exit=1)
    assert "has no attempt 9" in missing.stderr
    assert "does not exist" in sh("lakeshore jobs logs 987654321", exit=1).stderr
