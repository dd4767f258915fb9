"""What ended in a window (jobs/insight.py): counts, rates, wait and run times, the top
errors; the window's edges; a sample that stays bounded; the error's headline as the
database computes it; and the indexes the reads use."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import insight
from jobs.models import ERROR_HEADLINE_MAX_LENGTH, Invocation
from tests.jobs.test_invocation_indexes import _plan

pytestmark = pytest.mark.django_db

HOUR = insight.WINDOWS["1h"]
FINISHED_INDEXES = ("inv_ended", "inv_failures", "inv_finished")  # over finished_at
DAY = insight.WINDOWS["24h"]
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/job.py", line 3, in run\n'
    "    raise RuntimeError(message)\n"
    "RuntimeError: disk full on /scratch\n\n"
)


def ended(state, *, ago_s, waited_ms=0, ran_ms=0, queue="train", error="") -> Invocation:
    """An invocation that ended `ago_s` seconds ago after waiting and running so long
    (a killed one never started)."""
    finished = timezone.now() - timedelta(seconds=ago_s)
    started = finished - timedelta(milliseconds=ran_ms)
    row = Invocation.objects.create(queue=queue, function="a.b", state=state, error=error)
    Invocation.objects.filter(pk=row.pk).update(
        created_at=started - timedelta(milliseconds=waited_ms),
        started_at=None if state == "killed" else started,  # killed while queued
        finished_at=finished,
    )
    return row


def test_counts_rates_and_timings_of_the_last_hour():
    for i in range(1, 21):  # waited 10..200 ms, ran 100..2000 ms
        ended("succeeded", ago_s=60 + i, waited_ms=10 * i, ran_ms=100 * i)
    ended("failed", ago_s=30, error="boom")
    ended("killed", ago_s=30)
    ended("timeout", ago_s=30, error="timed out")
    ended("succeeded", ago_s=3700, ran_ms=999_000)  # ended before the window
    ended("succeeded", ago_s=30, queue="other")

    block = insight.ended(queue="train", span=HOUR)

    assert (block["succeeded"], block["failed"], block["killed"], block["timeout"]) == (20, 1, 1, 1)
    assert block["per_minute"]["succeeded"] == pytest.approx(20 / 60, abs=0.01)
    # the killed one never started: it has no timings; the three at 0 ms run/wait do
    assert block["timed"] == 22
    assert block["run_ms"] == {"p50": 900, "p95": 1900, "max": 2000}
    assert block["wait_ms"]["max"] == 200
    assert block["window"] == "1h" and block["until"] - block["since"] == timedelta(hours=1)


def test_every_queue_and_the_default_queue():
    ended("succeeded", ago_s=10, queue="")
    ended("succeeded", ago_s=10, queue="a")
    ended("failed", ago_s=10, queue="b")
    assert insight.ended(queue=None, span=HOUR)["succeeded"] == 2
    assert insight.ended(queue=None, span=HOUR)["failed"] == 1
    assert insight.ended(queue="", span=HOUR)["succeeded"] == 1


def test_the_day_window_holds_what_the_hour_does_not():
    ended("succeeded", ago_s=2 * 3600)
    assert insight.ended(queue="train", span=HOUR)["succeeded"] == 0
    assert insight.ended(queue="train", span=DAY)["succeeded"] == 1


def test_the_top_errors_group_by_headline_most_frequent_first():
    for _ in range(3):
        ended("failed", ago_s=20, error=TRACEBACK)
    last = ended("failed", ago_s=50, error=TRACEBACK.replace("\n\n", "\n"))
    other = ended("timeout", ago_s=10, error="timed out after 5 s\nsome detail")
    ended("failed", ago_s=7200, error="too old")
    ended("succeeded", ago_s=10)

    errors = insight.ended(queue="train", span=HOUR)["errors"]

    assert errors == [
        {"error": "RuntimeError: disk full on /scratch", "count": 4, "last_job": last.pk},
        {"error": "timed out after 5 s", "count": 1, "last_job": other.pk},
    ]


def test_at_most_ten_errors_are_shown():
    for i in range(12):
        ended("failed", ago_s=10, error=f"error {i}")
    assert len(insight.ended(queue="train", span=HOUR)["errors"]) == insight.TOP_ERRORS


@pytest.mark.parametrize(
    "error, headline",
    [
        (TRACEBACK, "RuntimeError: disk full on /scratch"),
        ("\n\n  first line\nsecond", "first line"),
        ("x" * 500, "x" * ERROR_HEADLINE_MAX_LENGTH),
        ("", ""),
    ],
)
def test_the_headline_of_an_error(error, headline):
    row = ended("failed", ago_s=1, error=error)
    assert Invocation.objects.values_list("error_headline", flat=True).get(pk=row.pk) == headline


def test_the_timings_read_the_newest_finishes_only(monkeypatch):
    monkeypatch.setattr(insight, "TIMED_SAMPLE", 3)
    for i in range(1, 11):  # the newest three ran 100, 200, 300 ms
        ended("succeeded", ago_s=i, ran_ms=100 * i)
    block = insight.ended(queue="train", span=HOUR)
    assert block["succeeded"] == 10  # counts stay exact
    assert block["timed"] == 3
    assert block["run_ms"] == {"p50": 200, "p95": 300, "max": 300}


def test_nothing_ended_says_so():
    block = insight.ended(queue="train", span=HOUR)
    assert block["succeeded"] == block["failed"] == 0 and block["timed"] == 0
    assert block["wait_ms"] == block["run_ms"] == {"p50": None, "p95": None, "max": None}
    assert block["errors"] == []


def test_three_statements_whatever_ended_and_each_reads_its_index():
    for i in range(30):
        ended("failed" if i % 3 else "succeeded", ago_s=i + 1, error=f"e{i % 4}")
    with CaptureQueriesContext(connection) as ctx:
        insight.ended(queue="train", span=HOUR)
    assert len(ctx.captured_queries) == 3
    # On a table this small the planner may take any index over finished_at (which one
    # fits best shows at 10 M rows: make bench's insight EXPLAINs); none reads the table
    for sql in ctx.captured_queries:
        plan = _plan(sql["sql"])
        assert any(name in plan for name in FINISHED_INDEXES), plan


def test_the_throughput_chart_has_a_point_a_bucket_zeros_included():
    ended("succeeded", ago_s=5)
    ended("failed", ago_s=5)
    ended("succeeded", ago_s=30 * 60)
    buckets = insight.throughput(queue="train", span=HOUR)
    assert len(buckets) in (60, 61)  # the first bucket straddles the window's start
    assert buckets[-1].counts["succeeded"] + buckets[-2].counts["succeeded"] >= 1
    assert sum(b.counts["succeeded"] for b in buckets) == 2
    assert sum(b.counts["failed"] for b in buckets) == 1
    assert all(b.at < c.at for b, c in zip(buckets, buckets[1:], strict=False))
