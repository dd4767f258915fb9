"""Per-job logs on the server (jobs/logs.py): a daemon ships what its jobs print, fenced
like a completion; anyone who may read jobs reads them by line number, follows them,
and sees where a long log was cut. Through the real API and PostgreSQL."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from jobs import logs, retention, wakeup
from jobs.models import Invocation, JobLog, LogChunk
from tests.support import builders
from tests.support.job_logs import ECHO, client, lines, read, registered, running_job, ship

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running():
    return running_job()


def test_what_a_daemon_ships_a_viewer_reads_in_order(running):
    job, me, daemon = running
    answer = ship(daemon, me, job, [["o", time.time(), "hello"], ["e", time.time(), "oops"]])
    assert answer.status_code == 200, answer.content
    assert answer.json() == [{"invocation": job, "attempt": 1, "seq": 0, "status": "stored"}]
    ship(daemon, me, job, lines(3), seq=1)
    page = read(job)
    assert [(line["n"], line["stream"], line["text"]) for line in page["lines"]] == [
        (0, "out", "hello"),
        (1, "err", "oops"),
        (2, "out", "line 0"),
        (3, "out", "line 1"),
        (4, "out", "line 2"),
    ]
    assert page["next_offset"] == page["total_lines"] == 5
    assert page["attempt"] == 1 and not page["finished"] and not page["complete"]
    assert read(job, offset=3)["lines"][0]["text"] == "line 1"
    assert [line["text"] for line in read(job, tail=2)["lines"]] == ["line 1", "line 2"]
    assert [line["text"] for line in read(job, stream="err")["lines"]] == ["oops"]


def test_paging_by_offset_reads_each_line_once(running):
    job, me, daemon = running
    for seq in range(5):
        ship(daemon, me, job, lines(40, start=seq * 40), seq=seq)
    seen, offset = [], 0
    while True:
        page = read(job, offset=offset, limit=15)
        seen += [line["text"] for line in page["lines"]]
        if page["next_offset"] >= page["total_lines"]:
            break
        offset = page["next_offset"]
    assert seen == [f"line {i}" for i in range(200)]


def test_since_keeps_the_lines_read_from_then_on(running):
    job, me, daemon = running
    then = time.time()
    ship(daemon, me, job, lines(2, at=then - 60) + lines(2, start=2, at=then))
    since = timezone.now() - timedelta(seconds=30)
    assert [line["text"] for line in read(job, since=since.isoformat())["lines"]] == [
        "line 2",
        "line 3",
    ]


def test_a_shipment_sent_again_is_stored_once(running):
    job, me, daemon = running
    assert ship(daemon, me, job, lines(2)).json()[0]["status"] == "stored"
    assert ship(daemon, me, job, lines(2)).json()[0]["status"] == "duplicate"
    assert read(job)["total_lines"] == 2


def test_another_daemons_credential_cannot_write_the_log(running):
    job, me, daemon = running
    other, other_client = registered(Invocation.objects.get(pk=job).queue)
    refused = ship(other_client, me, job, lines(1))  # speaking for the holder
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "not_your_daemon"
    stale = ship(other_client, other, job, lines(1))  # as itself: it holds no attempt
    assert stale.status_code == 200 and stale.json()[0]["status"] == "stale"
    assert read(job)["total_lines"] == 0
    # the negative control: the holder's own credential writes it
    assert ship(daemon, me, job, lines(1)).json()[0]["status"] == "stored"
    assert read(job)["total_lines"] == 1


def test_an_attempt_that_is_over_and_taken_again_refuses_the_old_holder(running):
    job, me, daemon = running
    Invocation.objects.filter(pk=job).update(attempts=2)  # re-dispatched meanwhile
    assert ship(daemon, me, job, lines(1)).json()[0]["status"] == "stale"
    assert JobLog.objects.count() == 0


def test_a_late_flush_after_the_outcome_is_kept_and_the_read_is_complete(running):
    job, me, daemon = running
    ship(daemon, me, job, lines(1))
    done = daemon.post(
        f"/api/v1/daemons/{me}/complete/",
        {"invocation": job, "attempt": 1, "state": "failed", "error": "boom"},
        format="json",
    )
    assert done.status_code == 200
    assert ship(daemon, me, job, lines(1, start=1), seq=1).json()[0]["status"] == "stored"
    page = read(job)
    assert page["finished"] and page["complete"] and page["total_lines"] == 2


def test_a_long_log_keeps_its_head_and_tail_with_one_marker(running, settings):
    settings.LAKESHORE_LOG_MAX_BYTES = 4096  # 2 KiB head, 2 KiB tail
    job, me, daemon = running
    text = "x" * 99  # 100 bytes a line with its newline
    for seq in range(20):
        chunk = [["o", time.time(), f"{seq * 10 + i:03d} {text[4:]}"] for i in range(10)]
        assert ship(daemon, me, job, chunk, seq=seq).status_code == 200
    page = read(job, limit=1000)
    numbers = [line["n"] for line in page["lines"] if line["stream"] == "out"]
    markers = [line for line in page["lines"] if line["stream"] == "cut"]
    assert numbers[:20] == list(range(20))  # the head: 2,000 bytes
    assert numbers[-1] == 199  # the tail ends with the last line
    assert len(markers) == 1
    cut = page["cut"]["lines"]
    assert cut == 200 - len(numbers)
    assert (
        f"{cut:,} lines" in markers[0]["text"] and "LAKESHORE_LOG_MAX_BYTES" in markers[0]["text"]
    )
    assert sum(chunk.bytes for chunk in LogChunk.objects.all()) <= 4096
    # the marker sits where the cut is: after the head, before the tail
    kinds = [line["stream"] for line in page["lines"]]
    assert kinds.index("cut") == 20


def test_one_chunk_bigger_than_the_tail_keeps_its_end(running, settings):
    settings.LAKESHORE_LOG_MAX_BYTES = 4096
    job, me, daemon = running
    big = [["o", time.time(), f"{i:05d}" + "y" * 94] for i in range(100)]  # 10,000 bytes
    ship(daemon, me, job, big)
    page = read(job)
    texts = [line["text"][:5] for line in page["lines"] if line["stream"] == "out"]
    assert texts[0] == "00000" and texts[-1] == "00099"
    assert page["cut"]["lines"] == 100 - len(texts)


def test_lines_the_daemon_lost_are_marked(running):
    job, me, daemon = running
    ship(daemon, me, job, lines(1))
    ship(daemon, me, job, lines(1, start=1), seq=1, dropped=1234)
    page = read(job)
    assert [line["stream"] for line in page["lines"]] == ["out", "dropped", "out"]
    assert "1,234 lines lost" in page["lines"][1]["text"]
    assert page["dropped_lines"] == 1234


def test_follow_waits_for_the_next_line(running):
    job, me, daemon = running
    ship(daemon, me, job, lines(1))

    def later():
        time.sleep(0.5)
        ship(daemon, me, job, lines(1, start=1), seq=1)

    writer = threading.Thread(target=later)
    writer.start()
    started = time.monotonic()
    page = read(job, offset=1, follow=1, wait=30)
    waited = time.monotonic() - started
    writer.join()
    assert [line["text"] for line in page["lines"]] == ["line 1"]
    assert 0.3 < waited < 15  # it waited for the line, not for its 30 s wait's end


def test_follow_ends_when_the_attempt_ends(running):
    job, me, daemon = running

    def later():
        time.sleep(0.5)
        daemon.post(
            f"/api/v1/daemons/{me}/complete/",
            {"invocation": job, "attempt": 1, "state": "succeeded"},
            format="json",
        )

    finisher = threading.Thread(target=later)
    finisher.start()
    page = read(job, follow=1, wait=10)
    finisher.join()
    assert page["lines"] == [] and page["finished"] and page["state"] == "succeeded"


@pytest.mark.parametrize(
    "bad,says",
    [
        ([["o", 1.0, "a\x00b"]], "no newline and no NUL"),
        ([["x", 1.0, "a"]], "'o' (stdout) or 'e' (stderr)"),
        ([["o", "noon", "a"]], "seconds since the epoch"),
        ([["o", 1.0, "z" * 20_000]], "split longer lines"),
        ([], "1 to 10,000 lines"),
        ([["o", 1.0]], "[stream, time, text]"),
    ],
)
def test_a_bad_line_is_refused_saying_why(running, bad, says):
    job, me, daemon = running
    answer = ship(daemon, me, job, bad)
    assert answer.status_code == 400
    assert says in str(answer.json()["error"]), answer.json()
    assert JobLog.objects.count() == 0


def test_reading_bad_parameters_and_unknown_attempts(running):
    job, _, _ = running
    viewer = client(builders.token("viewer"))
    assert viewer.get(f"/api/v1/jobs/{job}/logs/", {"attempt": 7}).status_code == 404
    assert viewer.get(f"/api/v1/jobs/{job}/logs/", {"limit": 0}).status_code == 400
    assert viewer.get(f"/api/v1/jobs/{job}/logs/", {"stream": "both"}).status_code == 400
    assert viewer.get(f"/api/v1/jobs/{job}/logs/", {"colour": "red"}).status_code == 400
    assert viewer.get("/api/v1/jobs/999999999/logs/").status_code == 404
    assert APIClient().get(f"/api/v1/jobs/{job}/logs/").status_code == 401


def test_retention_sweeps_the_logs_with_their_job(running):
    """Only the old job's log goes: the control, a running job's log, stays."""
    other, other_me, other_daemon = running_job()
    ship(other_daemon, other_me, other, lines(2))
    job, me, daemon = running
    ship(daemon, me, job, lines(3))
    daemon.post(
        f"/api/v1/daemons/{me}/complete/",
        {"invocation": job, "attempt": 1, "state": "succeeded"},
        format="json",
    )
    Invocation.objects.filter(pk=job).update(finished_at=timezone.now() - timedelta(days=400))
    counts = retention.retention_sweep()
    assert counts["invocations"] == 1
    assert list(JobLog.objects.values_list("invocation_id", flat=True)) == [other]
    assert set(LogChunk.objects.values_list("invocation_id", flat=True)) == {other}


def test_a_job_not_started_yet_is_not_finished_and_its_next_attempt_may_be_awaited():
    name = builders.queue().name
    operator = client(builders.token("operator"))
    job = operator.post(
        "/api/v1/jobs/", {"function": ECHO, "queue": name, "max_attempts": 2}, format="json"
    ).json()["id"]
    page = read(job)
    assert (page["attempt"], page["attempts"], page["finished"]) == (1, 0, False)
    me, daemon = registered(name)
    daemon.post(f"/api/v1/daemons/{me}/claim/", {"limit": 1}, format="json")
    daemon.post(
        f"/api/v1/daemons/{me}/complete/",
        {"invocation": int(job), "attempt": 1, "state": "failed", "error": "once"},
        format="json",
    )
    assert read(job)["finished"]  # attempt 1 is over: the job is queued again
    waiting = read(job, attempt=2)
    assert (waiting["state"], waiting["finished"]) == ("queued", False)
    viewer = client(builders.token("viewer"))
    assert viewer.get(f"/api/v1/jobs/{job}/logs/", {"attempt": 3}).status_code == 404


def test_a_shipment_costs_the_same_statements_however_many_chunks_it_holds():
    jobs = [running_job() for _ in range(6)]
    me = jobs[0][1]
    Invocation.objects.filter(pk__in=[job for job, _, _ in jobs]).update(daemon_id=me)

    def cost(shipped: list, seq: int) -> int:
        chunks = [
            {"invocation": job, "attempt": 1, "seq": seq, "dropped": 0, "lines": lines(50)}
            for job, _, _ in shipped
        ]
        with CaptureQueriesContext(connection) as statements:
            answers = logs.ship(daemon_id=me, chunks=chunks)
        assert {a["status"] for a in answers} == {"stored"}
        return len(statements)

    assert cost(jobs[:1], 0) == cost(jobs[1:], 0)  # new logs: their lines make rows
    assert cost(jobs[:1], 1) == cost(jobs, 2)  # logs with lines: joined to their last rows


def test_a_read_costs_the_same_statements_however_long_the_log():
    short, short_me, short_daemon = running_job()
    ship(short_daemon, short_me, short, lines(5))
    long, long_me, long_daemon = running_job()
    for seq in range(40):
        ship(long_daemon, long_me, long, lines(100, start=seq * 100), seq=seq)
    viewer = client(builders.token("viewer"))

    def cost(job) -> int:
        with CaptureQueriesContext(connection) as statements:
            page = viewer.get(f"/api/v1/jobs/{job}/logs/", {"limit": 10_000})
        assert page.status_code == 200
        return len(statements)

    cost(short)  # the token's first use notes itself once
    assert cost(short) == cost(long)


def test_a_follow_wakes_the_moment_a_line_is_shipped(running, monkeypatch):
    """The line's shipment is notified (log:ID) and wakes the follow. A follow also
    looks again now and then (50 ms apart, growing to 500 ms: for the attempt's end,
    which nothing notifies); here its looks are pushed out to its whole 30 s wait, so
    a follow the shipment did not wake would answer only then. Three follows, each
    answered within seconds of its line."""
    wait = wakeup.listener.wait
    monkeypatch.setattr(
        wakeup.listener,
        "wait",
        lambda queues, seen, timeout, renew=None: wait(queues, seen, 30, renew),
    )
    job, me, daemon = running
    for seq in range(3):
        shipped = {}

        def later(seq=seq, shipped=shipped):
            time.sleep(1.0)
            ship(daemon, me, job, lines(1, start=seq), seq=seq)
            shipped["at"] = time.monotonic()
            connection.close()

        writer = threading.Thread(target=later)
        writer.start()
        page = read(job, offset=seq, follow=1, wait=30)
        answered = time.monotonic()
        writer.join()
        assert [line["text"] for line in page["lines"]] == [f"line {seq}"]
        assert answered - shipped["at"] < 10  # woken by the line: its next look was 30 s on
