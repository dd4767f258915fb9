"""The one owner of invocation state changes.

    queued ──claim──▶ running ──complete──▶ succeeded | failed | timeout
       │                 │
       │                 ├──fail with attempts left / daemon gone──▶ queued (requeue)
       │                 └──daemon dropped / daemon exec kill──▶ killed
       └──kill / bulk-cancel / queue removed──▶ killed

Claim, complete, kill, drop, deregister, reap and the controller all change
invocations through the functions here, and nowhere else. Every change is one
conditional statement (the state it starts from is in its WHERE clause), so two
processes racing on a row can never both win; state names travel as parameters, not
as strings inside SQL. Terminal states never change.

Each function also counts what it changed for GET /metrics (lakeshore_admin/metrics.py),
from the rows its statement returns, once the transaction commits."""

from collections import Counter

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction

from fleet.models import CLAIMING_DAEMON_STATES, LIVE_DAEMON_STATES, DaemonState
from jobs.models import TERMINAL_STATES, Invocation, InvocationState
from lakeshore_admin import metrics
from lakeshore_admin.rows import model_rows
from queues.models import DISPATCHING_QUEUE_STATES

QUEUED = InvocationState.QUEUED.value
RUNNING = InvocationState.RUNNING.value
SUCCEEDED = InvocationState.SUCCEEDED.value
FAILED = InvocationState.FAILED.value
KILLED = InvocationState.KILLED.value
TIMEOUT = InvocationState.TIMEOUT.value
TERMINAL = [str(state) for state in TERMINAL_STATES]

_STATES = {
    "queued": QUEUED,
    "running": RUNNING,
    "succeeded": SUCCEEDED,
    "failed": FAILED,
    "killed": KILLED,
    "timeout": TIMEOUT,
    "claiming": [str(s) for s in CLAIMING_DAEMON_STATES],
    "live": [str(s) for s in LIVE_DAEMON_STATES],
    "dispatching": [str(s) for s in DISPATCHING_QUEUE_STATES],
    "busy": DaemonState.BUSY.value,
}


def _execute(sql: str, params: dict) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, {**_STATES, **params})
        return cursor.fetchall() if cursor.description else []


def _rowcount(sql: str, params: dict) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, {**_STATES, **params})
        return cursor.rowcount


# ---------------------------------------------------------------------------- submit

# A whole batch in one statement: arrays in, rows out. Ids come from the sequence in the
# batch's order; a key already taken in its queue (by another submit, or earlier in this
# batch) inserts nothing.
_INSERT_SQL = """
INSERT INTO jobs_invocation (queue, function, args, kwargs, priority, state, attempts,
                             max_attempts, timeout_s, key, reason, error, created_at)
SELECT u.queue, u.function, u.args::jsonb, u.kwargs::jsonb, u.priority, %(queued)s, 0,
       u.max_attempts, u.timeout_s, u.key, '', '', now()
  FROM unnest(%(queue)s::text[], %(function)s::text[], %(args)s::text[], %(kwargs)s::text[],
              %(priority)s::float8[], %(max_attempts)s::int[], %(timeout_s)s::int[],
              %(key)s::text[]) WITH ORDINALITY
       AS u(queue, function, args, kwargs, priority, max_attempts, timeout_s, key, n)
 ORDER BY u.n
    ON CONFLICT (queue, key) WHERE NOT (key = '') DO NOTHING
RETURNING *
"""


def insert_queued(items: list[dict]) -> list[Invocation]:
    """New queued invocations, one statement for the lot: the rows inserted (ids
    ascending in the order of `items`; an item whose key was taken has none)."""
    if not items:
        return []
    encode = DjangoJSONEncoder().encode
    params = {
        "queue": [i["queue"] for i in items],
        "function": [i["function"] for i in items],
        "args": [encode(i.get("args") or []) for i in items],
        "kwargs": [encode(i.get("kwargs") or {}) for i in items],
        "priority": [float(i.get("priority", 0)) for i in items],
        "max_attempts": [i.get("max_attempts", 1) for i in items],
        "timeout_s": [i.get("timeout_s") for i in items],
        "key": [i.get("key") or "" for i in items],
    }
    return model_rows(Invocation, _INSERT_SQL, {**_STATES, **params})


# One invocation in one statement, only into a queue that admits work and has no
# max_depth (a bounded queue serialises admission under a lock: the caller's slow path),
# or into the default queue. A key already taken inserts nothing either. Nothing back:
# the caller takes its careful path, which says why.
_INSERT_ADMITTED_SQL = """
INSERT INTO jobs_invocation (queue, function, args, kwargs, priority, state, attempts,
                             max_attempts, timeout_s, key, reason, error, created_at,
                             wire, args_blob, run_config)
SELECT %(queue)s::text, %(function)s, %(args)s::jsonb, %(kwargs)s::jsonb, %(priority)s,
       %(queued)s, 0, %(max_attempts)s, %(timeout_s)s, %(key)s, '', '', now(),
       %(wire)s, %(args_blob)s::bytea, %(run_config)s::jsonb
 WHERE %(queue)s::text = ''
    OR EXISTS (SELECT 1 FROM queues_queue q
                WHERE q.name = %(queue)s::text AND q.state = ANY(%(admitting)s)
                  AND COALESCE(q.max_depth, 0) = 0)
    ON CONFLICT (queue, key) WHERE NOT (key = '') DO NOTHING
RETURNING *
"""


def insert_if_admitted(item: dict, *, admitting: list[str]) -> Invocation | None:
    """The fast path of a submit: the new queued invocation, or None when the queue is
    missing, not admitting, bounded, or the key is taken (the caller then looks why)."""
    encode = DjangoJSONEncoder().encode
    params = {
        "queue": item["queue"],
        "function": item["function"],
        "args": encode(item.get("args") or []),
        "kwargs": encode(item.get("kwargs") or {}),
        "priority": item.get("priority", 0),
        "max_attempts": item.get("max_attempts", 1),
        "timeout_s": item.get("timeout_s"),
        "key": item.get("key") or "",
        "wire": item.get("wire") or "",
        "args_blob": item.get("args_blob"),
        "run_config": encode(item.get("run_config") or {}),
        "admitting": admitting,
    }
    rows = model_rows(Invocation, _INSERT_ADMITTED_SQL, {**_STATES, **params}, prepared=True)
    return rows[0] if rows else None


# ---------------------------------------------------------------------------- claim

# The daemon's liveness is part of the statement: its row is locked, and only a
# daemon that may take work (not draining, terminated or lost) gets anything. A drop,
# deregister or reap that commits first leaves this claim empty; one that comes later
# waits for this claim to commit and then sees (and ends) what it took. A claim that
# takes work marks a daemon that is not busy yet busy, in the same statement (`marked`):
# the daemon's row is written when busy/idle changes, not on every claim (idle comes
# back lazily: fleet/daemons.py, touch). A scale-down that waits on this lock sees the
# daemon busy when it gets it. The lock is the one that write needs: with a share
# lock, two claims of one daemon each held one and waited for the other's to write
# (a deadlock, broken by PostgreSQL after a second); now the second waits for the
# first to commit. Its invocations' foreign keys only need a key share, which this
# lock leaves free.
# An answer is bounded by bytes (issue 17): of the candidates it locks, in its order, a
# claim takes those whose arguments (args and kwargs as JSON text, plus args_blob) add
# up to at most `room` bytes, and the first one whatever its size when it is the first
# of the answer (`first`). Candidates past the bound are never marked running: they
# stay queued, locked only until this transaction ends.
# The queue's row is held too, with a key share (issue 17): queue removal locks it for
# update, so a removal and a claim of one queue never overlap. A claim that locked it
# first makes the removal wait for its commit and then see the work it took running
# (and refuse: queue_in_use); a removal that locked it first makes the claim wait, and
# the claim then finds no queue and takes nothing. Pause, drain and resume write the
# row without touching its key, so they never wait for a claim, nor a claim for them.
_CLAIM_SQL = """
WITH me AS (
    SELECT id, state FROM queues_daemon
     WHERE id = %(daemon)s AND state = ANY(%(claiming)s)
       FOR NO KEY UPDATE
), taken AS (
    UPDATE jobs_invocation
       SET state = %(running)s, daemon_id = (SELECT id FROM me), attempts = attempts + 1,
           started_at = now(), finished_at = NULL, scheduled_at = NULL, error = ''
     WHERE id = ANY(ARRAY({sized_head}
                    SELECT id{sizes}
                      FROM jobs_invocation
                     WHERE queue = %(queue)s AND state = %(queued)s
                       AND (scheduled_at IS NULL OR scheduled_at <= now())
                       AND EXISTS (SELECT 1 FROM me) {extra}
                       AND (%(queue)s = ''
                            OR EXISTS (SELECT 1 FROM queues_queue q
                                        WHERE q.name = %(queue)s
                                          AND q.state = ANY(%(dispatching)s)
                                          FOR KEY SHARE))
                     ORDER BY {order}
                     LIMIT %(limit)s
                       FOR UPDATE SKIP LOCKED{sized_tail}))
    RETURNING *
), marked AS (
    UPDATE queues_daemon d SET state = %(busy)s, updated_at = now()
      FROM me
     WHERE d.id = me.id AND me.state <> %(busy)s AND EXISTS (SELECT 1 FROM taken)
)
SELECT * FROM taken
"""

# The bound in bytes wraps the candidates: a running sum in their order. A claim of one
# that starts its answer takes its one candidate whatever it weighs, so it goes without
# (planning the wrapper costs a claim about 0.2 ms).
_SIZES = """, priority,
                           octet_length(args::text) + octet_length(kwargs::text)
                           + COALESCE(octet_length(args_blob), 0) AS size"""
_SIZED_HEAD = """
            SELECT id FROM (
                SELECT id, sum(size) OVER w AS upto, row_number() OVER w AS n
                  FROM ("""
_SIZED_TAIL = """) candidates
                WINDOW w AS (ORDER BY {order} ROWS UNBOUNDED PRECEDING)) sized
             WHERE upto <= %(room)s OR (n = 1 AND %(first)s)"""

ORDERS = {
    "oldest": ("id", lambda inv: inv.pk),
    "newest": ("id DESC", lambda inv: -inv.pk),
    "priority": ("priority DESC, id", lambda inv: (-inv.priority, inv.pk)),
}

# Where an id-ordered claim may start. A queue's oldest rows are mostly finished, and
# the planner, when its statistics say most rows are queued (a backlog just filled),
# walks the primary key from the table's first row through every finished one (2,200
# finished rows: 1.2 ms a claim, growing as the queue drains). The queued rows' own
# index (inv_queued_fifo) gives their first and last ids at once; starting the walk
# there keeps a claim's cost flat. A bound over all queued rows of the queue holds for
# any subset of them (a priority level, a wire, a back-off), and none queued: NULL, no row.
_BOUNDS = {
    "oldest": "AND id >= (SELECT min(id) FROM jobs_invocation"
    " WHERE queue = %(queue)s AND state = %(queued)s)",
    "newest": "AND id <= (SELECT max(id) FROM jobs_invocation"
    " WHERE queue = %(queue)s AND state = %(queued)s)",
    "priority": "",  # its own index (inv_queued_priority) gives the order
}


def claim(
    *,
    daemon_id: int,
    queue: str,
    order: str,
    limit: int,
    priority: float | None = None,
    wires: list[str] | None = None,
    room: int | None = None,
    first: bool = True,
) -> list[Invocation]:
    """queued → running for up to `limit` invocations of one queue, in `order`
    ('oldest', 'newest', 'priority'), optionally of one priority level only, and
    optionally only those whose arguments travel in one of `wires` (an SDK worker
    can run only what the SDK submitted). Their arguments weigh at most `room` bytes
    (default LAKESHORE_CLAIM_MAX_BYTES; jobs/claim_room.py), except that the first is
    taken whatever it weighs when `first` (it starts the answer)."""
    sql_order, key = ORDERS[order]
    extra = "" if priority is None else "AND priority = %(level)s"
    if wires is not None:
        extra += " AND wire = ANY(%(wires)s)"
    params = {
        "daemon": daemon_id,
        "queue": queue,
        "limit": limit,
        "level": priority,
        "wires": None if wires is None else [str(w) for w in wires],
        "room": settings.LAKESHORE_CLAIM_MAX_BYTES if room is None else room,
        "first": first,
    }
    sized = limit > 1 or not first
    sql = _CLAIM_SQL.format(
        order=sql_order,
        extra=f"{extra} {_BOUNDS[order]}",
        sizes=_SIZES if sized else "",
        sized_head=_SIZED_HEAD if sized else "",
        sized_tail=_SIZED_TAIL.format(order=sql_order) if sized else "",
    )
    rows = sorted(model_rows(Invocation, sql, {**_STATES, **params}), key=key)
    metrics.claimed(rows)
    return rows


def any_queued(queues: list[str]) -> bool:
    """Whether any of these queues holds a queued invocation (claimable now or not): an
    index-only look at the queued rows' own index."""
    if not queues:
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM jobs_invocation"
            " WHERE queue = ANY(%(queues)s) AND state = %(queued)s)",
            {"queues": queues, "queued": QUEUED},
        )
        return cursor.fetchone()[0]


# ---------------------------------------------------------------------------- complete

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
    rows = model_rows(Invocation, _COMPLETE_SQL, {**_STATES, **params}, prepared=True)
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


# ---------------------------------------------------------------------------- requeue

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


def _requeue(where: str, params: dict, reason: str) -> dict:
    rows = _execute(_REQUEUE_SQL.format(where=where), {**params, "reason": reason})
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
        "daemon_id IN (SELECT id FROM queues_daemon WHERE state = %(lost)s)",
        {"lost": DaemonState.LOST.value},
        "daemon gone (lost: no heartbeat)",
    )
    ended = _requeue(
        """(daemon_id IS NULL OR daemon_id IN (
               SELECT id FROM queues_daemon WHERE NOT (state = ANY(%(live)s))))""",
        {},
        "daemon gone",
    )
    return {key: lost[key] + ended[key] for key in lost}


def release_unheld(*, daemon_id: int, held: list[int], grace: float) -> int:
    """running → queued for this daemon's invocations that it says it does not hold and
    that were claimed more than `grace` seconds ago: the claim committed but its answer
    never reached the daemon, so it never ran. The attempt is given back."""
    return _rowcount(
        """UPDATE jobs_invocation
              SET state = %(queued)s, daemon_id = NULL, started_at = NULL,
                  attempts = GREATEST(attempts - 1, 0),
                  error = 'claimed, but the daemon never got it; requeued'
            WHERE daemon_id = %(daemon)s AND state = %(running)s
              AND NOT (id = ANY(%(held)s))
              AND started_at < now() - make_interval(secs => %(grace)s)""",
        {"daemon": daemon_id, "held": list(held), "grace": float(grace)},
    )


# ---------------------------------------------------------------------------- kill


def kill_queued(*, invocation_id: int, reason: str) -> bool:
    """queued → killed. False when it was not queued."""
    rows = _execute(
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
    rows = _execute(
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
    rows = _execute(
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
            rows = _execute(sql, {"queue": queue, "reason": reason, "batch": batch})
            metrics.killed_queued(Counter(name for (name,) in rows).items())
        done = len(rows)
        total += done
        if done < batch:
            return total


def kill_queued_of_queue(*, queue: str, reason: str) -> int:
    """queued → killed for one queue, inside the caller's transaction (queue removal)."""
    killed = _rowcount(
        """UPDATE jobs_invocation SET state = %(killed)s, reason = %(reason)s,
                  finished_at = now(), scheduled_at = NULL
            WHERE queue = %(queue)s AND state = %(queued)s""",
        {"queue": queue, "reason": reason},
    )
    metrics.killed_queued([(queue, killed)])
    return killed


# ---------------------------------------------------------------------------- timeout


def timeout_overdue(*, now) -> int:
    """running → timeout for invocations past their timeout_s (the daemon normally stops
    them itself; this catches the ones whose daemon did not report)."""
    rows = _execute(
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
