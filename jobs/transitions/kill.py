"""→ killed: a queued invocation (kill, bulk-cancel in batches, queue removal) and a
running one (an operator's daemon exec kill, a daemon dropped)."""

from django.db import transaction

from jobs.transitions.states import KILLED, execute, rowcount
from lakeshore_admin import metrics


def kill_queued(*, invocation_id: int, reason: str) -> bool:
    """queued → killed. False when it was not queued."""
    rows = execute(
        """UPDATE jobs_invocation SET state = %(killed)s, reason = %(reason)s,
                  finished_at = now(), scheduled_at = NULL
            WHERE id = %(id)s AND state = %(queued)s
        RETURNING queue""",
        {"id": invocation_id, "reason": reason},
    )
    metrics.killed_queued((queue, 1) for (queue,) in rows)
    return bool(rows)


def kill_running(*, invocation_id: int, daemon_id: int, reason: str) -> bool:
    """running → killed for one invocation while it runs on `daemon_id` (an operator
    stopped it there: `daemon exec`). False when it no longer runs there."""
    rows = execute(
        """UPDATE jobs_invocation SET state = %(killed)s, reason = %(reason)s,
                  finished_at = now()
            WHERE id = %(id)s AND state = %(running)s AND daemon_id = %(daemon)s
        RETURNING queue, started_at, finished_at""",
        {"id": invocation_id, "daemon": daemon_id, "reason": reason},
    )
    metrics.ended((queue, KILLED, started, finished) for queue, started, finished in rows)
    return bool(rows)


def kill_daemon_work(*, daemon_ids: list[int], reason: str) -> int:
    """running → killed for what these daemons run (an operator dropped them)."""
    rows = execute(
        """UPDATE jobs_invocation SET state = %(killed)s, reason = %(reason)s,
                  finished_at = now()
            WHERE daemon_id = ANY(%(ids)s) AND state = %(running)s
        RETURNING queue, started_at, finished_at""",
        {"ids": list(daemon_ids), "reason": reason},
    )
    metrics.ended((queue, KILLED, started, finished) for queue, started, finished in rows)
    return len(rows)


BULK_BATCH = 5_000

# One batch of a bulk-cancel: the next `batch` queued ids after `after` (keyset: each
# batch starts where the last one ended, so none re-reads what earlier ones killed),
# locked in id order and killed in one statement that answers how many ids it took, the
# last of them, and how many it killed in each queue (for the metrics): a few rows, not
# one per invocation.
# A row a claim in flight has locked makes the batch wait for that claim's commit; the
# row is then read again as the claim left it, and taken only if still queued. So work
# a claim took runs and is not killed, and candidates a claim locked but did not take
# (past its size bound, or a claim that rolled back) are killed, not left queued.
# Claims skip locked rows (SKIP LOCKED) and never wait for invocation rows, so a batch
# cannot deadlock with a claim; bulk-cancels and queue removal all lock queued rows in
# ascending id order, so they cannot deadlock with each other. A batch holds at most
# `batch` row locks, for the time its statement takes (about 50 ms for 5,000 rows, plus
# any wait for a claim's commit), and commits before the next starts.
_BATCH_SQL = """
WITH batch AS MATERIALIZED (
    SELECT ARRAY(SELECT id FROM jobs_invocation
                  WHERE state = %(queued)s {where} AND id > %(after)s
                  ORDER BY id LIMIT %(batch)s
                    FOR NO KEY UPDATE) AS ids
), killed AS (
    UPDATE jobs_invocation SET state = %(killed)s, reason = %(reason)s,
           finished_at = now(), scheduled_at = NULL
     WHERE id = ANY((SELECT ids FROM batch)::bigint[]) AND state = %(queued)s
    RETURNING queue
)
SELECT cardinality(ids), ids[cardinality(ids)], queue, n
  FROM batch LEFT JOIN (SELECT queue, count(*) AS n FROM killed GROUP BY queue) k ON true
"""


def kill_queued_in_batches(*, queue: str | None, reason: str, batch: int = BULK_BATCH) -> int:
    """queued → killed for every queued invocation (of one queue), a batch per
    transaction in id order, so no lock is ever held over the whole backlog. Work a
    claim takes meanwhile runs; everything else queued when its batch comes is killed.
    One statement per batch, whatever the number of queues."""
    sql = _BATCH_SQL.format(where="" if queue is None else "AND queue = %(queue)s")
    total, after = 0, 0
    while True:
        with transaction.atomic():
            rows = execute(sql, {"queue": queue, "reason": reason, "batch": batch, "after": after})
            counts = [(name, n) for _, _, name, n in rows if name is not None]
            metrics.killed_queued(counts)
        read, last = rows[0][0], rows[0][1]
        total += sum(n for _, n in counts)
        if read < batch:
            return total
        after = last


def kill_queued_of_queue(*, queue: str, reason: str) -> int:
    """queued → killed for one queue, inside the caller's transaction (queue removal).
    Its rows are locked in id order, as a bulk-cancel's batches lock them."""
    killed = rowcount(
        """UPDATE jobs_invocation SET state = %(killed)s, reason = %(reason)s,
                  finished_at = now(), scheduled_at = NULL
            WHERE id = ANY(ARRAY(SELECT id FROM jobs_invocation
                                  WHERE queue = %(queue)s AND state = %(queued)s
                                  ORDER BY id FOR NO KEY UPDATE))
              AND state = %(queued)s""",
        {"queue": queue, "reason": reason},
    )
    metrics.killed_queued([(queue, killed)])
    return killed


def kill_queued_ids(*, ids: list[int], reason: str) -> int:
    """queued → killed for those of `ids` still queued (a bulk-cancel with a search or a
    time: the caller found the batch), locked in id order as the batches above lock."""
    rows = execute(
        """UPDATE jobs_invocation SET state = %(killed)s, reason = %(reason)s,
                  finished_at = now(), scheduled_at = NULL
            WHERE id = ANY(ARRAY(SELECT id FROM jobs_invocation
                                  WHERE id = ANY(%(ids)s::bigint[]) AND state = %(queued)s
                                  ORDER BY id FOR NO KEY UPDATE))
              AND state = %(queued)s
        RETURNING queue""",
        {"ids": list(ids), "reason": reason},
    )
    counts: dict[str, int] = {}
    for (queue,) in rows:
        counts[queue] = counts.get(queue, 0) + 1
    metrics.killed_queued(counts.items())
    return len(rows)
