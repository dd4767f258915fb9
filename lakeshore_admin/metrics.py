"""The recorder of what happened, for GET /metrics (queues/metrics.py serves the scrape).

Invocations claimed and ended, how long they waited and ran, the controller's actions:
counted where the state changes (jobs/transitions/, fleet/controller.py) through the
helpers below, from what the statements already return (no query of their own), and
only once the transaction commits: a rolled-back change counts nothing. Every server
process counts (gunicorn's workers, the Celery worker that runs the reaper and the
controller), so prometheus_client runs in its multiprocess mode: each process writes its
figures to files of its own under PROMETHEUS_MULTIPROC_DIR (settings.py sets it, before
anything imports prometheus_client) and a scrape adds up the files of every process,
live or gone. Whichever worker serves the scrape, the totals are the same. `make run`
empties the directory when it starts: its counters start from zero, as after any
restart.

It imports no domain module: the domain calls it, and the collector above reads both.
"""

from collections import Counter as Tally
from collections.abc import Iterable, Sequence
from datetime import datetime

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from prometheus_client import Counter, Histogram, values

if values.ValueClass is values.MutexValue:  # the one-process kind
    raise ImproperlyConfigured(
        "prometheus_client was imported before the settings set PROMETHEUS_MULTIPROC_DIR: "
        "its counters would be per process. Import the Django settings first."
    )

# Seconds, from a fast claim to a day-long backlog or job.
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)

# registry=None: a scrape reads these from the processes' files (MultiProcessCollector),
# never from this process's memory.
ENDED = Counter(
    "lakeshore_invocations_ended",
    "Invocations that reached a final state (succeeded, failed, timeout, killed); a "
    "requeue is not an end.",
    ["queue", "state"],
    registry=None,
)
CLAIMED = Counter(
    "lakeshore_invocations_claimed",
    "Invocations handed to a daemon by a claim (one per attempt).",
    ["queue"],
    registry=None,
)
QUEUE_WAIT = Histogram(
    "lakeshore_invocation_queue_wait_seconds",
    "From submit (created_at) to the claim that handed the invocation to a daemon.",
    ["queue"],
    buckets=DURATION_BUCKETS,
    registry=None,
)
RUN_TIME = Histogram(
    "lakeshore_invocation_run_seconds",
    "From the claim (started_at) to the end (finished_at), for invocations that ended "
    "after running.",
    ["queue"],
    buckets=DURATION_BUCKETS,
    registry=None,
)
CONTROLLER_ACTIONS = Counter(
    "lakeshore_controller_actions",
    "The elasticity controller's events, by action (scale_up, scale_down, hold, "
    "launch_failed, tick_failed, tick_noop, ...).",
    ["queue", "action"],
    registry=None,
)


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


# ---------------------------------------------------------------------------- counting
# Called inside the statement's transaction; the figures are written after it commits.
# robust: a metrics file that cannot be written is logged, never the caller's error.


def claimed(invocations: Sequence) -> None:
    """Invocations a claim statement just set running (its RETURNING rows)."""
    if not invocations:
        return
    waits = [(row.queue, _seconds(row.created_at, row.started_at)) for row in invocations]

    def count() -> None:
        for queue, n in Tally(queue for queue, _ in waits).items():
            CLAIMED.labels(queue).inc(n)
        for queue, wait in waits:
            if wait is not None:
                QUEUE_WAIT.labels(queue).observe(wait)

    transaction.on_commit(count, robust=True)


def ended(rows: Iterable[tuple]) -> None:
    """Invocations a statement just ended: (queue, state, started_at, finished_at) each.
    started_at is None for one that never ran (killed while queued): counted, no run
    time."""
    rows = [
        (queue, str(state), _seconds(started, finished)) for queue, state, started, finished in rows
    ]
    if not rows:
        return

    def count() -> None:
        for (queue, state), n in Tally((queue, state) for queue, state, _ in rows).items():
            ENDED.labels(queue, state).inc(n)
        for queue, _, ran in rows:
            if ran is not None:
                RUN_TIME.labels(queue).observe(ran)

    transaction.on_commit(count, robust=True)


def killed_queued(counts: Iterable[tuple[str, int]]) -> None:
    """(queue, how many) killed while queued, from a statement that returns counts."""
    counts = [(queue, n) for queue, n in counts if n]
    if not counts:
        return

    def count() -> None:
        for queue, n in counts:
            ENDED.labels(queue, "killed").inc(n)

    transaction.on_commit(count, robust=True)


def controller_acted(event) -> None:
    """A QueueEvent the controller just wrote."""
    queue, action = event.queue.name, str(event.action)
    transaction.on_commit(lambda: CONTROLLER_ACTIONS.labels(queue, action).inc(), robust=True)
