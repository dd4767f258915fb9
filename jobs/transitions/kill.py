"""→ killed: a queued invocation (kill, bulk-cancel in batches, queue removal) and a
running one (an operator's daemon exec kill, a daemon dropped)."""

from collections import Counter

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


def kill_queued_in_batches(*, queue: str | None, reason: str, batch: int = BULK_BATCH) -> int:
    """queued → killed for every queued invocation (of one queue), a batch per
    transaction, so no lock is ever held over the whole backlog. Rows a claim holds at
    that moment are skipped: they are about to run."""
    where = "" if queue is None else "AND queue = %(queue)s"
    sql = f"""
        UPDATE jobs_invocation SET state = %(killed)s, reason = %(reason)s,
               finished_at = now(), scheduled_at = NULL
         WHERE id = ANY(ARRAY(
                SELECT id FROM jobs_invocation
                 WHERE state = %(queued)s {where}
                 ORDER BY id LIMIT %(batch)s
                   FOR UPDATE SKIP LOCKED))
        RETURNING queue"""  # noqa: S608 - no input in the format
    total = 0
    while True:
        with transaction.atomic():
            rows = execute(sql, {"queue": queue, "reason": reason, "batch": batch})
            metrics.killed_queued(Counter(name for (name,) in rows).items())
        done = len(rows)
        total += done
        if done < batch:
            return total


def kill_queued_of_queue(*, queue: str, reason: str) -> int:
    """queued → killed for one queue, inside the caller's transaction (queue removal)."""
    killed = rowcount(
        """UPDATE jobs_invocation SET state = %(killed)s, reason = %(reason)s,
                  finished_at = now(), scheduled_at = NULL
            WHERE queue = %(queue)s AND state = %(queued)s""",
        {"queue": queue, "reason": reason},
    )
    metrics.killed_queued([(queue, killed)])
    return killed
