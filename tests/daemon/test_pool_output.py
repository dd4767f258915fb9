"""What a job prints, captured per invocation by the pool (lakeshore.pool.monitor): real
`lakeshore.runner` processes in both isolations, no server. The lines an invocation
printed are its own, all there when its outcome is delivered, up to a kill, and none
reaches the next invocation of a warm process."""

import os
import signal
import time

import pytest

from tests.daemon.test_pool import Harness

ISOLATIONS = ["pool", "process"]


@pytest.fixture
def make():
    made: list[Harness] = []

    def build(isolation: str, **options) -> Harness:
        made.append(Harness(isolation=isolation, **options))
        made[-1].pool.prepare()
        return made[-1]

    yield build
    for h in made:
        h.pool.close()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_thousand_lines_on_each_stream_arrive_whole_and_apart(make, isolation):
    h = make(isolation)
    item = h.start("chatter", 1000)
    assert h.wait(item)[0] == "succeeded"
    assert h.lines(item, "o") == [f"out {i}" for i in range(1000)]
    assert h.lines(item, "e") == [f"err {i}" for i in range(1000)]
    assert h.printed_at_outcome[item.id] == 2000  # every line before the outcome


def test_the_next_job_in_a_warm_process_sees_nothing_of_the_last(make):
    h = make("pool")
    first = h.start("chatter", 50, "first ")
    h.wait(first)
    second = h.start("chatter", 50, "second ")
    assert h.wait(second)[1] == h.wait(first)[1]  # the same process ran both
    assert not any("first" in line for line in h.lines(second))
    assert not any("second" in line for line in h.lines(first))
    assert len(h.lines(first)) == len(h.lines(second)) == 100
    assert None not in h.printed  # nothing printed between them


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_crash_leaves_its_traceback_in_the_log(make, isolation):
    h = make(isolation)
    item = h.start("crash")
    state, _, error = h.wait(item)
    assert state == "failed" and "RuntimeError: crashed on purpose" in error
    assert h.lines(item, "o") == ["about to crash"]
    err = h.lines(item, "e")
    assert err[0] == "Traceback (most recent call last):"
    assert err[-1] == "RuntimeError: crashed on purpose"


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_kill_9_keeps_what_it_printed_before(make, isolation, tmp_path):
    h = make(isolation)
    marker = tmp_path / "pid"
    item = h.start("print_then_die", str(marker))
    deadline = time.monotonic() + 20
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.02)
    os.kill(int(marker.read_text()), signal.SIGKILL)
    state, _, error = h.wait(item)
    assert state == "failed" and "code -9" in error
    assert h.lines(item, "o") == ["before the kill", "an unended line"]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_timeout_keeps_what_it_printed_before(make, isolation, tmp_path):
    h = make(isolation)
    item = h.start("print_then_die", str(tmp_path / "pid"), timeout_s=1)
    assert h.wait(item)[0] == "timeout"
    assert h.lines(item, "o") == ["before the kill", "an unended line"]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_logging_records_at_info_reach_stderr(make, isolation):
    h = make(isolation)
    item = h.start("log_records")
    assert h.wait(item)[0] == "succeeded"
    assert h.lines(item, "e") == ["INFO trainer: epoch 1 loss 0.5"]


def test_a_pool_process_puts_the_root_logger_back(make):
    """The control for the next job: what the last one configured does not leak."""
    h = make("pool")
    first = h.start("log_records")
    h.wait(first)
    again = h.start("log_records")
    h.wait(again)
    assert h.lines(again, "e") == ["INFO trainer: epoch 1 loss 0.5"]


def test_a_line_without_its_end_arrives_when_the_job_ends(make):
    h = make("pool")
    item = h.start("no_newline", "half a line")
    h.wait(item)
    assert h.lines(item, "o") == ["half a line"]
