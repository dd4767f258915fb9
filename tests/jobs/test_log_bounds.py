"""Issue 29, item 11: a job's log is bounded in rows, not only in bytes, and closes a
short grace after its attempt ended. Through the real API (POST …/daemons/<id>/logs/,
with the daemon's own credential) and PostgreSQL.

- A daemon that ships a line at a time (100 one-line chunks a shipment) made a row a
  line: its lines are now joined to the attempt's last row, every line kept.
- A daemon that says it dropped lines before every line (a row each: the marker's
  place) fills at most LAKESHORE_LOG_MAX_ROWS rows: the head and the tail keep half
  each, and the marker line says how many lines were cut (none silently lost).
- A daemon that holds an ended attempt kept appending to it for good: past
  LAKESHORE_LOG_APPEND_GRACE_SECONDS after the end (or after a failed attempt's retry
  was due) its shipment is refused, 409 log_closed, nothing stored.
Each with its control: the bound raised (or the grace not passed), the attack goes
through."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Invocation, JobLog, LogChunk
from tests.support.job_logs import lines, read, running_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.security]


@pytest.fixture
def running():
    return running_job()


def one_line_chunks(job, seq: int, count: int, *, dropped: int = 0) -> list[dict]:
    """`count` chunks of one line each, seqs from `seq`, lines numbered from `seq`."""
    return [
        {"invocation": job, "attempt": 1, "seq": seq + i, "lines": lines(1, start=seq + i)}
        | ({"dropped": dropped} if dropped else {})
        for i in range(count)
    ]


def ship_all(daemon, me, chunks: list[dict]):
    answer = daemon.post(f"/api/v1/daemons/{me}/logs/", {"chunks": chunks}, format="json")
    return answer.status_code, answer.json()


def rows_of(job) -> int:
    return LogChunk.objects.filter(invocation_id=job, attempt=1).count()


# ---------------------------------------------------------------------------- rows


def test_a_line_at_a_time_fills_a_row_not_a_row_a_line(running):
    job, me, daemon = running
    for seq in range(0, 500, 100):
        status, answers = ship_all(daemon, me, one_line_chunks(job, seq, 100))
        assert status == 200 and {a["status"] for a in answers} == {"stored"}
    assert rows_of(job) == 1
    page = read(job, limit=1000)
    assert [line["text"] for line in page["lines"]] == [f"line {i}" for i in range(500)]
    assert page["cut"] is None and page["total_lines"] == 500


def test_past_the_rows_bound_the_tail_is_cut_and_the_marker_says_so(running, settings):
    settings.LAKESHORE_LOG_MAX_ROWS = 20  # 10 rows of head, 10 of tail
    job, me, daemon = running
    for seq in range(0, 200, 100):
        assert ship_all(daemon, me, one_line_chunks(job, seq, 100, dropped=1))[0] == 200
    assert rows_of(job) == 20
    page = read(job, limit=1000)
    kept = [line["n"] for line in page["lines"] if line["stream"] == "out"]
    assert kept == [*range(10), *range(190, 200)]  # the first rows, and the last
    assert page["total_lines"] == 200 and page["cut"]["lines"] == 180
    (marker,) = [line for line in page["lines"] if line["stream"] == "cut"]
    assert "180 lines" in marker["text"] and "LAKESHORE_LOG_MAX_ROWS" in marker["text"]
    assert marker["n"] == 10  # where the cut is: after the head, before the tail
    log = JobLog.objects.get(invocation_id=job, attempt=1)
    assert (log.head_rows, log.tail_rows, log.lines) == (10, 10, 200)


def test_negative_control_with_no_rows_bound_each_such_line_takes_a_row(running, settings):
    settings.LAKESHORE_LOG_MAX_ROWS = 10**9
    job, me, daemon = running
    for seq in range(0, 200, 100):
        ship_all(daemon, me, one_line_chunks(job, seq, 100, dropped=1))
    assert rows_of(job) == 200


# ---------------------------------------------------------------------------- grace


def complete(daemon, me, job, state="succeeded"):
    answer = daemon.post(
        f"/api/v1/daemons/{me}/complete/",
        {"invocation": job, "attempt": 1, "state": state}
        | ({"error": "boom"} if state == "failed" else {}),
        format="json",
    )
    assert answer.status_code == 200, answer.content


def test_lines_for_an_attempt_ended_past_the_grace_are_refused(running, settings):
    settings.LAKESHORE_LOG_APPEND_GRACE_SECONDS = 60
    job, me, daemon = running
    other, _, _ = running_job()
    Invocation.objects.filter(pk=other).update(daemon_id=me)  # a second job, still running
    assert ship_all(daemon, me, one_line_chunks(job, 0, 1))[0] == 200
    complete(daemon, me, job)
    # within the grace: a late flush is kept
    assert ship_all(daemon, me, one_line_chunks(job, 1, 1))[1][0]["status"] == "stored"
    ended = timezone.now() - timedelta(seconds=61)
    Invocation.objects.filter(pk=job).update(finished_at=ended)
    late = one_line_chunks(job, 2, 3)
    live = [{"invocation": other, "attempt": 1, "seq": 0, "lines": lines(1)}]
    status, answer = ship_all(daemon, me, live + late)
    assert (status, answer["error"]["code"]) == (409, "log_closed")
    assert answer["error"]["closed"] == [{"invocation": job, "attempt": 1}]
    assert "LAKESHORE_LOG_APPEND_GRACE_SECONDS" in answer["error"]["message"]
    assert read(job)["total_lines"] == 2 and read(other)["total_lines"] == 0  # none stored
    assert ship_all(daemon, me, live)[0] == 200  # the rest, sent again, is taken


def test_a_failed_attempt_waiting_for_its_retry_closes_after_the_grace(settings):
    settings.LAKESHORE_LOG_APPEND_GRACE_SECONDS = 60
    settings.LAKESHORE_RETRY_BACKOFF = 3600  # its retry waits: the attempt stays the daemon's
    job, me, daemon = running_job()
    Invocation.objects.filter(pk=job).update(max_attempts=2)
    complete(daemon, me, job, state="failed")
    row = Invocation.objects.get(pk=job)
    assert (row.state, row.daemon_id, row.attempts) == ("queued", int(me), 1)
    assert ship_all(daemon, me, one_line_chunks(job, 0, 1))[0] == 200  # its retry not due
    Invocation.objects.filter(pk=job).update(scheduled_at=timezone.now() - timedelta(seconds=61))
    status, answer = ship_all(daemon, me, one_line_chunks(job, 1, 1))
    assert (status, answer["error"]["code"]) == (409, "log_closed")


def test_negative_control_with_a_long_grace_the_ended_attempt_takes_lines(running, settings):
    settings.LAKESHORE_LOG_APPEND_GRACE_SECONDS = 10**9
    job, me, daemon = running
    complete(daemon, me, job)
    Invocation.objects.filter(pk=job).update(finished_at=timezone.now() - timedelta(days=30))
    for seq in range(3):
        assert ship_all(daemon, me, one_line_chunks(job, seq, 1))[0] == 200
    assert read(job)["total_lines"] == 3
