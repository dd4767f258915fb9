"""Retention: finished invocations, controller events, the SDK's result frames and the
queues' samples (the charts' time series) older than LAKESHORE_RETENTION_DAYS are
deleted, a batch at a time, by the beat task `jobs.retention` (and `manage.py prune`).

Each batch is one statement in a short transaction of its own. It takes at most
`batch_size` ids, lowest first, with FOR UPDATE SKIP LOCKED, so it never holds locks
over more rows than that, two sweeps at once take different rows, and neither waits on
the other (nor on a request that holds one of the rows). A run stops after
`max_batches` batches of each kind; the next run goes on from there.

Queued and running invocations are never deleted, whatever their age; a finished one
without finished_at is kept too. No other table holds a database foreign key to
invocations (a retry's `retry_of` and a daemon command's invocation have none), so a
batch deletes them with nothing else to clear.
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from jobs.models import TERMINAL_STATES

log = logging.getLogger(__name__)

BATCH_SIZE = 5000
MAX_BATCHES = 20  # per kind and run: 100,000 rows of each an hour at the defaults


# Written out like the SQL in jobs/services.py; tests/jobs/test_retention.py checks that
# no foreign key with a database constraint points at either table.
_INVOCATIONS_SQL = """
WITH doomed AS MATERIALIZED (
    SELECT id FROM jobs_invocation
     WHERE state = ANY(%(states)s) AND finished_at < %(cutoff)s
     ORDER BY id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM jobs_invocation WHERE id = ANY(ARRAY(SELECT id FROM doomed))
"""


_OLDER_THAN = """
DELETE FROM {table}
 WHERE id = ANY(ARRAY(
    SELECT id FROM {table}
     WHERE {column} < %(cutoff)s
     ORDER BY {order}
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
 ))
"""


def _older_than(table: str, column: str, order: str) -> str:
    """A batch of `table`'s rows whose `column` is before the cutoff, taken along
    `order` (an indexed column), skipping rows another transaction holds. The names
    come from this module only; the values are bound."""
    return _OLDER_THAN.format(table=table, column=column, order=order)


_EVENTS_SQL = _older_than("queues_queueevent", "at", "id")
# The SDK's result journal (jobs.ResultFrame), by the frame's own age.
_FRAMES_SQL = _older_than("jobs_resultframe", "created_at", "id")
# The queues' samples (queues.QueueSample, one per queue a minute), by their minute,
# oldest first along their index on `at`; nothing references them.
_SAMPLES_SQL = _older_than("queues_queuesample", "at", "at")
# The audit trail (accounts.AuditEvent), by its own retention.
_AUDIT_SQL = _older_than("accounts_auditevent", "at", "at")
# Operators' orders to daemons (queues.DaemonCommand: daemon exec), by their own age, as
# the invocations they name go (their reference has no database constraint).
_COMMANDS_SQL = _older_than("queues_daemoncommand", "created_at", "id")


def _delete_in_batches(sql: str, params: dict, *, batch_size: int, max_batches: int) -> int:
    deleted = 0
    for _ in range(max_batches):
        # durable: each batch commits on its own, even if a caller wraps the sweep in a
        # transaction by mistake (that raises instead of holding every lock to the end).
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(sql, {**params, "limit": batch_size})
            n = cursor.rowcount
        deleted += n
        if n < batch_size:
            break  # nothing more is due (or another sweep holds the rest)
    return deleted


def retention_cutoff(now: datetime | None = None, days: float | None = None) -> datetime:
    days = settings.LAKESHORE_RETENTION_DAYS if days is None else days
    return (now or timezone.now()) - timedelta(days=days)


def retention_sweep(
    *, now: datetime | None = None, batch_size: int = BATCH_SIZE, max_batches: int = MAX_BATCHES
) -> dict:
    """Delete finished invocations (terminal state, finished_at before the cutoff),
    queue events (`at` before the cutoff) and result frames (created before it), queue
    samples older than LAKESHORE_SAMPLE_RETENTION_DAYS and audit rows older than
    LAKESHORE_AUDIT_RETENTION_DAYS, and daemon commands (created before the cutoff), at
    most batch_size * max_batches of each. Returns {"invocations": n, "events": m,
    "commands": c, "frames": f, "samples": s, "audit": a}. Safe to run twice at once."""
    if batch_size < 1 or max_batches < 1:
        raise ValueError("batch_size and max_batches must be at least 1")
    cutoff = retention_cutoff(now)
    limits = {"batch_size": batch_size, "max_batches": max_batches}
    counts = {
        "invocations": _delete_in_batches(
            _INVOCATIONS_SQL,
            {"states": [str(state) for state in TERMINAL_STATES], "cutoff": cutoff},
            **limits,
        ),
        "events": _delete_in_batches(_EVENTS_SQL, {"cutoff": cutoff}, **limits),
        "commands": _delete_in_batches(_COMMANDS_SQL, {"cutoff": cutoff}, **limits),
        "frames": _delete_in_batches(_FRAMES_SQL, {"cutoff": cutoff}, **limits),
        "samples": _delete_in_batches(
            _SAMPLES_SQL,
            {"cutoff": retention_cutoff(now, settings.LAKESHORE_SAMPLE_RETENTION_DAYS)},
            **limits,
        ),
        "audit": _delete_in_batches(
            _AUDIT_SQL,
            {"cutoff": retention_cutoff(now, settings.LAKESHORE_AUDIT_RETENTION_DAYS)},
            **limits,
        ),
    }
    if any(counts.values()):
        log.info("retention: deleted %s (finished before %s)", counts, cutoff.isoformat())
    return counts
