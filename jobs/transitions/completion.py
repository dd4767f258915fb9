"""running → succeeded | failed | timeout (or back to queued, for a failure with attempts
left): a daemon's reports, each fenced by its daemon and attempt; keeping the outcome of
a report that came after a kill (killed stays killed); telling a retried report from a
refused one; and the reaper's timeout of invocations past timeout_s."""

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder

from jobs.models import Invocation
from jobs.transitions.states import (
    FAILED,
    KILLED,
    QUEUED,
    RUNNING,
    STATE_PARAMS,
    SUCCEEDED,
    TIMEOUT,
    execute,
)
from lakeshore_admin import metrics
from lakeshore_admin.rows import model_rows

# A failed attempt with attempts left goes back to the queue after a back-off (with
# jitter), keeping its daemon and attempt, so that a retried report of that same
# failure is recognised as already recorded.
# Many outcomes of one daemon in one statement, each fenced alone (its daemon, its
# attempt, still running): an outcome that does not match changes nothing, and the
# caller looks at why. A single report is a list of one.
_COMPLETE_SQL = """
UPDATE jobs_invocation i
   SET state = CASE
           WHEN u.outcome = %(failed)s AND u.retry AND i.attempts < i.max_attempts
           THEN %(queued)s
           ELSE u.outcome END,
       scheduled_at = CASE
           WHEN u.outcome = %(failed)s AND u.retry AND i.attempts < i.max_attempts
           THEN now() + make_interval(secs => LEAST(%(cap)s, %(base)s * power(2, i.attempts - 1))
                                             * (0.5 + random() / 2))
           ELSE NULL END,
       finished_at = CASE
           WHEN u.outcome = %(failed)s AND u.retry AND i.attempts < i.max_attempts THEN NULL
           ELSE now() END,
       result = CASE WHEN u.outcome = %(succeeded)s THEN u.result::jsonb ELSE NULL END,
       result_blob = CASE WHEN u.outcome = %(succeeded)s THEN u.result_blob ELSE NULL END,
       error = u.error
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(outcomes)s::text[],
              %(results)s::text[], %(blobs)s::bytea[], %(errors)s::text[],
              %(retries)s::boolean[])
       AS u(id, attempt, outcome, result, result_blob, error, retry)
 WHERE i.id = u.id AND i.daemon_id = %(daemon)s AND i.attempts = u.attempt
   AND i.state = %(running)s
RETURNING i.*
"""

_OUTCOMES = {"succeeded": SUCCEEDED, "failed": FAILED, "timeout": TIMEOUT}


def complete_many(*, daemon_id: int, outcomes: list[dict]) -> dict[int, Invocation]:
    """running → succeeded | failed | timeout (or queued, for a failure with attempts
    left, unless its `retry` is False) for each outcome {invocation, attempt, state,
    result, result_blob, error, retry} that the daemon still holds, in one statement.
    The rows as recorded, by id (read in the same statement, so a claim that follows
    at once cannot show through). The ids must be distinct."""
    if not outcomes:
        return {}
    encode = DjangoJSONEncoder().encode
    ok = [o["state"] == "succeeded" for o in outcomes]
    params = {
        "daemon": daemon_id,
        "ids": [int(o["invocation"]) for o in outcomes],
        "attempts": [int(o["attempt"]) for o in outcomes],
        "outcomes": [_OUTCOMES[o["state"]] for o in outcomes],
        "results": [
            encode(o.get("result")) if s else None for o, s in zip(outcomes, ok, strict=True)
        ],
        "blobs": [o.get("result_blob") if s else None for o, s in zip(outcomes, ok, strict=True)],
        "errors": ["" if s else (o.get("error") or "") for o, s in zip(outcomes, ok, strict=True)],
        "retries": [o.get("retry", True) is not False for o in outcomes],
        "base": float(settings.LAKESHORE_RETRY_BACKOFF),
        "cap": float(settings.LAKESHORE_RETRY_BACKOFF_MAX),
    }
    rows = model_rows(Invocation, _COMPLETE_SQL, {**STATE_PARAMS, **params}, prepared=True)
    metrics.ended(
        (row.queue, row.state, row.started_at, row.finished_at)
        for row in rows
        if row.state != QUEUED  # a failure with attempts left: requeued, not ended
    )
    return {row.pk: row for row in rows}


def complete(
    *,
    daemon_id: int,
    invocation_id: int,
    attempt: int,
    outcome: str,
    result,
    error: str,
    result_blob: bytes | None = None,
    retry: bool = True,
) -> Invocation | None:
    """One outcome (complete_many of one): the row as recorded, or None when nothing
    was recorded."""
    item = {
        "invocation": invocation_id,
        "attempt": attempt,
        "state": outcome,
        "result": result,
        "result_blob": result_blob,
        "error": error,
        "retry": retry,
    }
    return complete_many(daemon_id=daemon_id, outcomes=[item]).get(int(invocation_id))


# A kill that races a finishing job: an operator's daemon exec ended the attempt while it
# ran, but the job finished its work before the order reached its daemon, which then
# reports the outcome. The report is refused (killed stays killed); which outcome it
# brought is kept, with when it came. Fenced as a completion is: the daemon and the
# attempt the killed claim belonged to. Once: a retried report (its answer lost) finds it
# kept and moves nothing. A kill of a running attempt leaves the error its claim cleared,
# whereas a row requeued after a recorded failure keeps that failure's error when it is
# killed in the queue: so a retried report of that failure, which was recorded, is never
# taken for a discarded one. (A dropped daemon's reports do not get this far: its
# credential is revoked, and a daemon no longer live records nothing.)
_DISCARD_SQL = """
UPDATE jobs_invocation
   SET discarded_outcome = %(outcome)s, discarded_at = now()
 WHERE id = %(id)s AND daemon_id = %(daemon)s AND attempts = %(attempt)s
   AND state = %(killed)s AND error = '' AND discarded_outcome = ''
RETURNING *
"""


def record_discarded_outcome(
    *, daemon_id: int, invocation_id: int, attempt: int, outcome: str
) -> Invocation | None:
    """For a report that complete refused: when the attempt was killed while it ran, the
    outcome the daemon reported is kept as discarded (the state stays killed). The row
    as it is then, or None when nothing was kept (not a kill of this daemon's attempt,
    or one kept before)."""
    params = {
        "daemon": daemon_id,
        "id": int(invocation_id),
        "attempt": int(attempt),
        "outcome": _OUTCOMES[outcome],
    }
    rows = model_rows(Invocation, _DISCARD_SQL, {**STATE_PARAMS, **params})
    return rows[0] if rows else None


def already_recorded(invocation: Invocation, *, daemon_id: int, attempt: int, outcome: str):
    """For a completion that changed nothing: True when this daemon's report of this
    attempt with this outcome was recorded before (a retry after a lost response),
    False when that attempt ended otherwise, None when the claim is not the daemon's."""
    if invocation.daemon_id != daemon_id or invocation.attempts != attempt:
        return None
    recorded_as = {SUCCEEDED: [SUCCEEDED], TIMEOUT: [TIMEOUT], FAILED: [FAILED, QUEUED]}
    if invocation.state in recorded_as[outcome]:
        return True
    if invocation.state in (RUNNING, KILLED):
        return None  # still someone's, or killed by a drop: the claim was taken away
    return False


# ---------------------------------------------------------------------------- timeout


def timeout_overdue(*, now) -> int:
    """running → timeout for invocations past their timeout_s (the daemon normally stops
    them itself; this catches the ones whose daemon did not report)."""
    rows = execute(
        """UPDATE jobs_invocation
              SET state = %(timeout)s, finished_at = %(now)s,
                  error = 'exceeded timeout_s (' || timeout_s || ' s)'
            WHERE state = %(running)s AND timeout_s IS NOT NULL
              AND started_at + make_interval(secs => timeout_s) < %(now)s
        RETURNING queue, started_at, finished_at""",
        {"now": now},
    )
    metrics.ended((queue, TIMEOUT, started, finished) for queue, started, finished in rows)
    return len(rows)
