"""running → queued (or failed, with no attempt left) for work whose daemon went away
(left, lost, deleted), and for a claim whose answer never reached its daemon."""

from fleet.models import Daemon, DaemonState
from jobs.transitions.states import FAILED, QUEUED, execute, rowcount
from lakeshore_admin import metrics

# Work whose daemon went away goes back to the queue while attempts remain (at once:
# it was not the job's fault), and otherwise ends failed.
_REQUEUE_SQL = """
UPDATE jobs_invocation
   SET state = CASE WHEN attempts < max_attempts THEN %(queued)s ELSE %(failed)s END,
       daemon_id = CASE WHEN attempts < max_attempts THEN NULL ELSE daemon_id END,
       started_at = CASE WHEN attempts < max_attempts THEN NULL ELSE started_at END,
       finished_at = CASE WHEN attempts < max_attempts THEN NULL ELSE now() END,
       error = CASE WHEN attempts < max_attempts THEN %(reason)s || '; requeued'
                    ELSE %(reason)s END
 WHERE state = %(running)s AND {where}
RETURNING state, queue, started_at, finished_at
"""


_DAEMONS = Daemon._meta.db_table  # fleet's daemons, whose state says whether work is orphaned


def _requeue(where: str, params: dict, reason: str) -> dict:
    rows = execute(_REQUEUE_SQL.format(where=where), {**params, "reason": reason})
    requeued = sum(1 for (state, *_) in rows if state == QUEUED)
    metrics.ended(
        (queue, state, started, finished)
        for state, queue, started, finished in rows
        if state == FAILED
    )
    return {"requeued": requeued, "failed": len(rows) - requeued}


def requeue_daemon_work(*, daemon_ids: list[int], reason: str) -> dict:
    """What these daemons ran: back to the queue, or failed when no attempt is left."""
    return _requeue("daemon_id = ANY(%(ids)s)", {"ids": list(daemon_ids)}, reason)


def rescue_orphans() -> dict:
    """Running invocations whose daemon is no longer live (lost, terminated, deleted):
    requeued while attempts remain, else failed with "daemon gone"."""
    lost = _requeue(
        f"daemon_id IN (SELECT id FROM {_DAEMONS} WHERE state = %(lost)s)",  # noqa: S608
        {"lost": DaemonState.LOST.value},
        "daemon gone (lost: no heartbeat)",
    )
    ended = _requeue(
        f"""(daemon_id IS NULL OR daemon_id IN (
               SELECT id FROM {_DAEMONS} WHERE NOT (state = ANY(%(live)s))))""",  # noqa: S608
        {},
        "daemon gone",
    )
    return {key: lost[key] + ended[key] for key in lost}


def release_unheld(*, daemon_id: int, held: list[int], grace: float) -> int:
    """running → queued for this daemon's invocations that it says it does not hold and
    that were claimed more than `grace` seconds ago: the claim committed but its answer
    never reached the daemon, so it never ran. The attempt is given back."""
    return rowcount(
        """UPDATE jobs_invocation
              SET state = %(queued)s, daemon_id = NULL, started_at = NULL,
                  attempts = GREATEST(attempts - 1, 0),
                  error = 'claimed, but the daemon never got it; requeued'
            WHERE daemon_id = %(daemon)s AND state = %(running)s
              AND NOT (id = ANY(%(held)s))
              AND started_at < now() - make_interval(secs => %(grace)s)""",
        {"daemon": daemon_id, "held": list(held), "grace": float(grace)},
    )
