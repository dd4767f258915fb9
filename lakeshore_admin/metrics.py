"""The recorder of what happened, for GET /metrics (queues/metrics.py serves the scrape).

Invocations claimed and ended, how long they waited and ran, the controller's actions:
counted where the state changes (jobs/transitions/, queues/services.py) through the
helpers below, from what the statements already return (no query of their own), and
only once the transaction commits: a rolled-back change counts nothing.

The totals live in PostgreSQL, in one table (queues.models.MetricTotal), so a scrape of
any web process on any host answers the same figures, whichever process counted them
(gunicorn's workers, the Celery worker's reaper and controller, `manage.py reap`). A
count adds to this process's deltas in memory; a flush adds them to the table in one
statement (INSERT … ON CONFLICT DO UPDATE SET value = value + the delta) and forgets
them. A process flushes from a thread of its own about every
LAKESHORE_METRICS_FLUSH_SECONDS (only when it counted something), before a scrape it
serves, and when it exits (atexit; gunicorn's worker_exit; Celery's
worker_process_shutdown). A process killed with SIGKILL loses what it counted since
its last flush; a flush that fails gives its deltas back for the next one.

The tests' settings start no thread and flush at no exit: their counts reach the table
only through a scrape in the same process, so inside the test's transaction.

It imports no domain module: the domain calls it, and the collector reads both.
"""

import atexit
import json
import logging
import os
import threading
import time
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

logger = logging.getLogger(__name__)

# queues.models.MetricTotal's table: this module names it, the model takes the name.
TABLE = "queues_metrictotal"

# Seconds, from a fast claim to a day-long backlog or job.
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
BOUNDS = tuple(floatToGoString(bound) for bound in DURATION_BUCKETS) + ("+Inf",)


@dataclass(frozen=True)
class Family:
    """A counter or a histogram as the scrape shows it (prometheus_client's names: a
    counter's samples are NAME_total)."""

    name: str
    kind: str  # "counter" or "histogram"
    help: str
    labels: tuple[str, ...]


ENDED = Family(
    "lakeshore_invocations_ended",
    "counter",
    "Invocations that reached a final state (succeeded, failed, timeout, killed); a "
    "requeue is not an end.",
    ("queue", "state"),
)
CLAIMED = Family(
    "lakeshore_invocations_claimed",
    "counter",
    "Invocations handed to a daemon by a claim (one per attempt).",
    ("queue",),
)
QUEUE_WAIT = Family(
    "lakeshore_invocation_queue_wait_seconds",
    "histogram",
    "From submit (created_at) to the claim that handed the invocation to a daemon.",
    ("queue",),
)
RUN_TIME = Family(
    "lakeshore_invocation_run_seconds",
    "histogram",
    "From the claim (started_at) to the end (finished_at), for invocations that ended "
    "after running.",
    ("queue",),
)
CONTROLLER_ACTIONS = Family(
    "lakeshore_controller_actions",
    "counter",
    "The elasticity controller's events, by action (scale_up, scale_down, hold, "
    "launch_failed, tick_failed, tick_noop, ...).",
    ("queue", "action"),
)
FAMILIES = (ENDED, CLAIMED, QUEUE_WAIT, RUN_TIME, CONTROLLER_ACTIONS)

# The table's rows: (sample name, labels as JSON) → value. A counter is one row,
# NAME_total. A histogram is NAME_sum and one NAME_bucket row per bucket that was hit,
# labelled le, holding the observations of that bucket alone (the scrape adds them up
# into Prometheus's cumulative buckets, and their total is NAME_count).
Key = tuple[str, str]

# One statement, however many rows; in a fixed order (of the key), so that two processes
# flushing the same rows at once lock them in the same order and never deadlock.
UPSERT = f"""
INSERT INTO {TABLE} AS total (name, labels, value)
SELECT * FROM unnest(%s::varchar[], %s::jsonb[], %s::double precision[])
ON CONFLICT (name, labels) DO UPDATE SET value = total.value + EXCLUDED.value
"""  # noqa: S608 - a constant table name


def _key(name: str, family: Family, values: Sequence[str], **extra: str) -> Key:
    labels = dict(zip(family.labels, values, strict=True), **extra)
    return name, json.dumps(labels, sort_keys=True, separators=(",", ":"))


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def _observe(deltas: Tally, family: Family, seconds: float, *values: str) -> None:
    bound = BOUNDS[bisect_left(DURATION_BUCKETS, seconds)]  # le: the first bound ≥ seconds
    deltas[_key(f"{family.name}_bucket", family, values, le=bound)] += 1
    deltas[_key(f"{family.name}_sum", family, values)] += seconds


# ---------------------------------------------------------------------------- deltas

_pending: Tally = Tally()  # what this process counted since its last flush
_pending_lock = threading.Lock()
# One flush at a time in a process: a scrape's flush waits for the thread's to commit,
# so the scrape's read sees everything its own process counted.
_flush_lock = threading.Lock()
_flusher_pid: int | None = None  # set once this process's thread runs (not inherited by a fork)


def _add(deltas: Tally) -> None:
    with _pending_lock:
        _pending.update(deltas)
    if _flusher_pid is None and settings.LAKESHORE_METRICS_FLUSH_THREAD:
        _start_flusher()


def _start_flusher() -> None:
    global _flusher_pid
    with _pending_lock:
        if _flusher_pid is not None:
            return
        _flusher_pid = os.getpid()
    every = settings.LAKESHORE_METRICS_FLUSH_SECONDS
    threading.Thread(target=_flush_every, args=(every,), name="metrics-flush", daemon=True).start()
    atexit.register(flush_at_exit)


def _flush_every(seconds: float) -> None:
    while True:
        time.sleep(seconds)
        try:
            flush()
        except Exception as exc:
            logger.warning("metrics: counts not written, kept for the next flush: %s", exc)
        finally:
            connection.close()  # back to the pool until the next flush


def _forked() -> None:
    """A forked child (a prefork pool's worker) starts empty: what its parent counted is
    the parent's to flush, and the parent's thread did not come along."""
    global _pending, _pending_lock, _flush_lock, _flusher_pid
    _pending, _pending_lock, _flush_lock = Tally(), threading.Lock(), threading.Lock()
    _flusher_pid = None


os.register_at_fork(after_in_child=_forked)


def flush() -> int:
    """Add this process's deltas to the table in one statement (none when there are
    none), on this thread's connection, and forget them. Raises when the write fails,
    after giving them back. Returns how many rows it wrote."""
    with _flush_lock:
        with _pending_lock:
            deltas = +_pending  # the non-zero ones
            _pending.clear()
        if not deltas:
            return 0
        rows = sorted(deltas.items())
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    UPSERT,
                    [
                        [name for (name, _), _ in rows],
                        [labels for (_, labels), _ in rows],
                        [float(value) for _, value in rows],
                    ],
                )
        except BaseException:
            with _pending_lock:
                _pending.update(deltas)
            raise
        return len(rows)


def flush_at_exit(*args, **kwargs) -> None:
    """The last flush of an exiting process (atexit, gunicorn's worker_exit, Celery's
    worker_process_shutdown; their arguments are ignored)."""
    try:
        flush()
    except Exception as exc:
        logger.warning("metrics: the counts of this process were lost at exit: %s", exc)
    finally:
        connection.close()


def discard() -> None:
    """Forget what this process counted and did not flush (the tests, between tests)."""
    with _pending_lock:
        _pending.clear()


# ---------------------------------------------------------------------------- the scrape


def families(rows: Iterable[tuple[str, dict, float]]) -> list:
    """prometheus_client's families from the table's rows (name, labels, value)."""
    values: dict[str, dict[tuple, dict]] = {family.name: {} for family in FAMILIES}
    for name, labels, value in rows:
        base, _, suffix = name.rpartition("_")
        if base not in values:
            continue  # not a sample of these families (a row of another version)
        family = next(f for f in FAMILIES if f.name == base)
        series = tuple(labels.get(label, "") for label in family.labels)
        figures = values[base].setdefault(series, {})
        figures[labels.get("le", suffix) if suffix == "bucket" else suffix] = value
    found = []
    for family in FAMILIES:
        if family.kind == "counter":
            metric = CounterMetricFamily(family.name, family.help, labels=list(family.labels))
            for series, figures in sorted(values[family.name].items()):
                metric.add_metric(list(series), figures.get("total", 0.0))
        else:
            metric = HistogramMetricFamily(family.name, family.help, labels=list(family.labels))
            for series, figures in sorted(values[family.name].items()):
                running, buckets = 0.0, []
                for bound in BOUNDS:
                    running += figures.get(bound, 0.0)
                    buckets.append((bound, running))
                metric.add_metric(list(series), buckets, figures.get("sum", 0.0))
        found.append(metric)
    return found


# ---------------------------------------------------------------------------- counting
# Called inside the statement's transaction; the deltas are kept once it commits.


def claimed(invocations: Sequence) -> None:
    """Invocations a claim statement just set running (its RETURNING rows)."""
    if not invocations:
        return
    deltas: Tally = Tally()
    for row in invocations:
        deltas[_key(f"{CLAIMED.name}_total", CLAIMED, [row.queue])] += 1
        wait = _seconds(row.created_at, row.started_at)
        if wait is not None:
            _observe(deltas, QUEUE_WAIT, wait, row.queue)
    transaction.on_commit(lambda: _add(deltas), robust=True)


def ended(rows: Iterable[tuple]) -> None:
    """Invocations a statement just ended: (queue, state, started_at, finished_at) each.
    started_at is None for one that never ran (killed while queued): counted, no run
    time."""
    deltas: Tally = Tally()
    for queue, state, started, finished in rows:
        deltas[_key(f"{ENDED.name}_total", ENDED, [queue, str(state)])] += 1
        ran = _seconds(started, finished)
        if ran is not None:
            _observe(deltas, RUN_TIME, ran, queue)
    if deltas:
        transaction.on_commit(lambda: _add(deltas), robust=True)


def killed_queued(counts: Iterable[tuple[str, int]]) -> None:
    """(queue, how many) killed while queued, from a statement that returns counts."""
    deltas: Tally = Tally()
    for queue, n in counts:
        if n:
            deltas[_key(f"{ENDED.name}_total", ENDED, [queue, "killed"])] += n
    if deltas:
        transaction.on_commit(lambda: _add(deltas), robust=True)


def controller_acted(event) -> None:
    """A QueueEvent the controller just wrote."""
    key = _key(
        f"{CONTROLLER_ACTIONS.name}_total",
        CONTROLLER_ACTIONS,
        [event.queue.name, str(event.action)],
    )
    transaction.on_commit(lambda: _add(Tally({key: 1})), robust=True)
