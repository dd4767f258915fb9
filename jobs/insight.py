"""What ended in a window, for one queue or for every queue: how many succeeded, failed,
were killed or timed out, and their rate a minute; how long they waited (submitted →
started) and ran (started → finished), as p50, p95 and max; and the errors that came up
most, each with its count and the newest job that had it.

Read from the database on each ask, from two indexes over `finished_at` (inv_ended for
the counts and timings, inv_failures for the errors), so a window costs what ended in
it, not what the table holds. The counts are exact. The timings are of the newest
TIMED_SAMPLE finishes in the window (`timed` says how many): a percentile of a busy
hour does not need every row, and a window of millions stays one bounded read.
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.utils import timezone

from jobs.models import InvocationState

TIMED_SAMPLE = 10_000
TOP_ERRORS = 10


@dataclass(frozen=True)
class Window:
    name: str  # as the CLI and the API take it: 1h, 24h
    span: timedelta
    block: str  # the key of its block in a stats answer
    bucket: timedelta  # one point of its throughput chart


WINDOWS = {
    w.name: w
    for w in (
        Window("1h", timedelta(hours=1), "last_hour", timedelta(minutes=1)),
        Window("24h", timedelta(days=1), "last_day", timedelta(minutes=15)),
    )
}
DEFAULT_WINDOW = "1h"
BUCKET_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)  # fixed: a bucket keeps its bounds
ENDED = [
    InvocationState.SUCCEEDED,
    InvocationState.FAILED,
    InvocationState.KILLED,
    InvocationState.TIMEOUT,
]

# `queue` NULL: every queue.
_COUNTS_SQL = """
SELECT state, count(*)
  FROM jobs_invocation
 WHERE finished_at >= %(since)s AND finished_at < %(until)s
   AND (%(queue)s::varchar IS NULL OR queue = %(queue)s::varchar)
 GROUP BY state
"""

# Percentiles in milliseconds; wait from submit to the (last) start.
_TIMINGS_SQL = """
SELECT count(*),
       percentile_disc(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY wait_ms),
       max(wait_ms),
       percentile_disc(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY run_ms),
       max(run_ms)
  FROM (SELECT round(extract(epoch FROM started_at - created_at) * 1000)::bigint AS wait_ms,
               round(extract(epoch FROM finished_at - started_at) * 1000)::bigint AS run_ms
          FROM jobs_invocation
         WHERE finished_at >= %(since)s AND finished_at < %(until)s
           AND (%(queue)s::varchar IS NULL OR queue = %(queue)s::varchar)
           AND started_at IS NOT NULL
         ORDER BY finished_at DESC
         LIMIT %(sample)s) AS newest
"""

_ERRORS_SQL = """
SELECT error_headline, count(*), max(id)
  FROM jobs_invocation
 WHERE state IN (%(failed)s, %(timeout)s)
   AND finished_at >= %(since)s AND finished_at < %(until)s
   AND (%(queue)s::varchar IS NULL OR queue = %(queue)s::varchar)
 GROUP BY error_headline
 ORDER BY count(*) DESC, max(id) DESC
 LIMIT %(top)s
"""

# Ended a bucket, by state: the throughput chart.
_SERIES_SQL = """
SELECT date_bin(%(bucket)s, finished_at, %(origin)s) AS at, state, count(*)
  FROM jobs_invocation
 WHERE finished_at >= %(since)s AND finished_at < %(until)s
   AND (%(queue)s::varchar IS NULL OR queue = %(queue)s::varchar)
 GROUP BY 1, 2
"""


def window(name: str | None) -> Window:
    """The window by its name (None: the default); callers check names with
    WINDOWS first, so an unknown one here is a programming error."""
    return WINDOWS[name or DEFAULT_WINDOW]


def _params(queue: str | None, span: Window, now: datetime | None) -> dict:
    """What the statements here take: the window up to now, the queue, the bounds."""
    until = now or timezone.now()
    return {
        "since": until - span.span,
        "until": until,
        "queue": queue,
        "sample": TIMED_SAMPLE,
        "top": TOP_ERRORS,
        "failed": InvocationState.FAILED,
        "timeout": InvocationState.TIMEOUT,
        "bucket": span.bucket,
        "origin": BUCKET_ORIGIN,
    }


def _spread(values, maximum) -> dict:
    p50, p95 = values or (None, None)
    return {"p50": p50, "p95": p95, "max": maximum}


def ended(*, queue: str | None, span: Window, now: datetime | None = None) -> dict:
    """What ended in the window up to now, of `queue` ('' the default queue, None
    every queue)."""
    params = _params(queue, span, now)
    until = params["until"]
    with connection.cursor() as cursor:
        cursor.execute(_COUNTS_SQL, params)
        counts = dict(cursor.fetchall())
        cursor.execute(_TIMINGS_SQL, params)
        timed, wait, wait_max, run, run_max = cursor.fetchone()
        cursor.execute(_ERRORS_SQL, params)
        errors = [
            {"error": error, "count": count, "last_job": last_job}
            for error, count, last_job in cursor.fetchall()
        ]
    minutes = span.span.total_seconds() / 60
    return {
        "window": span.name,
        "since": params["since"],
        "until": until,
        **{state: counts.get(state, 0) for state in ENDED},
        "per_minute": {state: round(counts.get(state, 0) / minutes, 2) for state in ENDED},
        "wait_ms": _spread(wait, wait_max),
        "run_ms": _spread(run, run_max),
        "timed": timed,
        "errors": errors,
    }


@dataclass
class Bucket:
    at: datetime
    counts: dict[str, int]


def throughput(*, queue: str | None, span: Window, now: datetime | None = None) -> list[Bucket]:
    """How many ended in each bucket of the window, by state, oldest first; a bucket
    where nothing ended is there with zeros, so a chart of it is a flat line."""
    params = _params(queue, span, now)
    until, origin = params["until"], BUCKET_ORIGIN
    with connection.cursor() as cursor:
        cursor.execute(_SERIES_SQL, params)
        rows = cursor.fetchall()
    first = origin + (params["since"] - origin) // span.bucket * span.bucket
    buckets: dict[datetime, Bucket] = {}
    at = first
    while at < until:
        buckets[at] = Bucket(at, dict.fromkeys(ENDED, 0))
        at += span.bucket
    for at, state, count in rows:
        if at in buckets:
            buckets[at].counts[state] = count
    return list(buckets.values())


# The run and wait times of each bucket, over the newest TIMED_SAMPLE finishes.
_TIMINGS_SERIES_SQL = """
SELECT date_bin(%(bucket)s, finished_at, %(origin)s) AS at,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY run_ms),
       percentile_disc(0.95) WITHIN GROUP (ORDER BY run_ms),
       percentile_disc(0.5) WITHIN GROUP (ORDER BY wait_ms)
  FROM (SELECT finished_at,
               round(extract(epoch FROM finished_at - started_at) * 1000)::bigint AS run_ms,
               round(extract(epoch FROM started_at - created_at) * 1000)::bigint AS wait_ms
          FROM jobs_invocation
         WHERE finished_at >= %(since)s AND finished_at < %(until)s
           AND (%(queue)s::varchar IS NULL OR queue = %(queue)s::varchar)
           AND started_at IS NOT NULL
         ORDER BY finished_at DESC
         LIMIT %(sample)s) AS newest
 GROUP BY 1
 ORDER BY 1
"""


@dataclass
class Timing:
    at: datetime
    run_p50: int
    run_p95: int
    wait_p50: int


def timings(*, queue: str | None, span: Window, now: datetime | None = None) -> list[Timing]:
    """Run time (p50, p95) and wait (p50) in milliseconds of each bucket of the window
    where something that ran ended, oldest first (of the newest TIMED_SAMPLE finishes)."""
    with connection.cursor() as cursor:
        cursor.execute(_TIMINGS_SERIES_SQL, _params(queue, span, now))
        return [Timing(*row) for row in cursor.fetchall()]
