"""Retention: finished invocations, controller events, the SDK's result frames and the
queues' samples (the charts' time series) older than LAKESHORE_RETENTION_DAYS are
deleted, a batch at a time, by the beat task `jobs.retention` (and `manage.py prune`).

Each batch is one statement in a short transaction of its own. It takes at most
`batch_size` ids, lowest first, with FOR UPDATE SKIP LOCKED, so it never holds locks
over more rows than that, two sweeps at once take different rows, and neither waits on
the other (nor on a request that holds one of the rows).

A run keeps pace with any inflow it can: it goes on, batch after batch, until nothing
of any kind is due or its time budget (LAKESHORE_RETENTION_BUDGET_SECONDS for the beat
task; none for `manage.py prune` unless given) runs out; the next run goes on from
there. The kinds take turns, a batch each, so a flood of one (finished invocations)
never starves another (result frames). A short batch says a kind is done for the run.

Queued and running invocations are never deleted, whatever their age; a finished one
without finished_at is kept too. An invocation's logs (jobs.JobLog, jobs.LogChunk) go in
the same statement as the invocation. No other table holds a database foreign key to
invocations (a retry's `retry_of` and a daemon command's invocation have none), so a
batch deletes them with nothing else to clear.
"""

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from fleet.models import DaemonCommand
from jobs.models import TERMINAL_STATES
from lakeshore_admin import hooks

log = logging.getLogger(__name__)

BATCH_SIZE = 5000


# Written out like the SQL in jobs/transitions/; tests/jobs/test_retention_cutoffs.py checks
# that no foreign key with a database constraint points at either table.
_INVOCATIONS_SQL = """
WITH doomed AS MATERIALIZED (
    SELECT id FROM jobs_invocation
     WHERE state = ANY(%(states)s) AND finished_at < %(cutoff)s
     ORDER BY id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
log_chunks AS (
    DELETE FROM jobs_logchunk WHERE invocation_id = ANY(ARRAY(SELECT id FROM doomed))
),
logs AS (
    DELETE FROM jobs_joblog WHERE invocation_id = ANY(ARRAY(SELECT id FROM doomed))
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
# Each stream's totals (jobs.ResultStream), once its last frame is past the cutoff; a
# topic's leave its credential's totals (jobs.TopicWriter) with it. Answers the count of
# streams deleted.
_STREAMS_SQL = """
WITH gone AS (
    DELETE FROM jobs_resultstream
     WHERE id = ANY(ARRAY(
        SELECT id FROM jobs_resultstream
         WHERE updated_at < %(cutoff)s
         ORDER BY updated_at
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED
     ))
    RETURNING attempt, writer_token_id, frames, bytes
), topics AS (
    SELECT writer_token_id, sum(frames) AS frames, sum(bytes) AS bytes
      FROM gone WHERE attempt = 0 AND writer_token_id IS NOT NULL
     GROUP BY writer_token_id
), credited AS (
    UPDATE jobs_topicwriter w
       SET frames = GREATEST(w.frames - t.frames, 0), bytes = GREATEST(w.bytes - t.bytes, 0)
      FROM topics t
     WHERE w.token_id = t.writer_token_id
)
SELECT count(*) FROM gone
"""
# The queues' samples (queues.QueueSample, one per queue a minute), by their minute,
# oldest first along their index on `at`; nothing references them.
_SAMPLES_SQL = _older_than("queues_queuesample", "at", "at")
# The audit trail (accounts.AuditEvent), by its own retention.
_AUDIT_SQL = _older_than("accounts_auditevent", "at", "at")
# Operators' orders to daemons (fleet.DaemonCommand: daemon exec), by their own age, as
# the invocations they name go (their reference has no database constraint).
_COMMANDS_SQL = _older_than(DaemonCommand._meta.db_table, "created_at", "id")


def _delete_batch(sql: str, params: dict, batch_size: int) -> int:
    # durable: each batch commits on its own, even if a caller wraps the sweep in a
    # transaction by mistake (that raises instead of holding every lock to the end).
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql, {**params, "limit": batch_size})
        return cursor.fetchone()[0] if cursor.description else cursor.rowcount


def _sweep(kinds: dict, *, batch_size: int, deadline: float | None, max_batches: int | None):
    """Batches of each kind in turn until every kind is done (a short batch: nothing
    more is due, or another sweep holds the rest), `deadline` (time.monotonic()) has
    passed, or a kind has had `max_batches`. Counts by kind."""
    counts = dict.fromkeys(kinds, 0)
    batches = dict.fromkeys(kinds, 0)
    pending = list(kinds)
    while pending:
        for kind in list(pending):
            sql, params = kinds[kind]
            n = _delete_batch(sql, params, batch_size)
            counts[kind] += n
            batches[kind] += 1
            hooks.point("retention.batch_done")
            if n < batch_size or (max_batches is not None and batches[kind] >= max_batches):
                pending.remove(kind)
            if deadline is not None and time.monotonic() >= deadline:
                return counts
    return counts


def retention_cutoff(now: datetime | None = None, days: float | None = None) -> datetime:
    days = settings.LAKESHORE_RETENTION_DAYS if days is None else days
    return (now or timezone.now()) - timedelta(days=days)


def retention_sweep(
    *,
    now: datetime | None = None,
    batch_size: int = BATCH_SIZE,
    budget: float | None = None,
    max_batches: int | None = None,
) -> dict:
    """Delete finished invocations (terminal state, finished_at before the cutoff),
    queue events (`at` before the cutoff), result frames (created before it) and their
    streams' totals (last written before it), queue
    samples older than LAKESHORE_SAMPLE_RETENTION_DAYS and audit rows older than
    LAKESHORE_AUDIT_RETENTION_DAYS, and daemon commands (created before the cutoff),
    until none is due, or `budget` seconds have passed (None: no budget; a batch that
    started always finishes), or each kind has had `max_batches` batches (None: no cap).
    Returns {"invocations": n, "events": m, "commands": c, "frames": f, "streams": t,
    "samples": s, "audit": a}. Safe to run twice at once."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if max_batches is not None and max_batches < 1:
        raise ValueError("max_batches must be at least 1 (or None: no cap)")
    if budget is not None and budget <= 0:
        raise ValueError("budget must be more than 0 seconds (or None: until done)")
    deadline = None if budget is None else time.monotonic() + budget
    cutoff = retention_cutoff(now)
    kinds = {
        "invocations": (
            _INVOCATIONS_SQL,
            {"states": [str(state) for state in TERMINAL_STATES], "cutoff": cutoff},
        ),
        "events": (_EVENTS_SQL, {"cutoff": cutoff}),
        "commands": (_COMMANDS_SQL, {"cutoff": cutoff}),
        "frames": (_FRAMES_SQL, {"cutoff": cutoff}),
        "streams": (_STREAMS_SQL, {"cutoff": cutoff}),
        "samples": (
            _SAMPLES_SQL,
            {"cutoff": retention_cutoff(now, settings.LAKESHORE_SAMPLE_RETENTION_DAYS)},
        ),
        "audit": (
            _AUDIT_SQL,
            {"cutoff": retention_cutoff(now, settings.LAKESHORE_AUDIT_RETENTION_DAYS)},
        ),
    }
    counts = _sweep(kinds, batch_size=batch_size, deadline=deadline, max_batches=max_batches)
    if any(counts.values()):
        log.info("retention: deleted %s (finished before %s)", counts, cutoff.isoformat())
    return counts


def scheduled_sweep() -> dict:
    """The beat task's run: until nothing is due or LAKESHORE_RETENTION_BUDGET_SECONDS
    have passed (it runs every LAKESHORE_RETENTION_EVERY_SECONDS)."""
    return retention_sweep(budget=settings.LAKESHORE_RETENTION_BUDGET_SECONDS)
