"""queued → running: a daemon's claim (and the exchange's), one statement that locks
the daemon, the queue and the candidates, bounded in count and in bytes.

The statement reads and writes fleet's daemon table (fleet.models.Daemon): it locks the
claiming daemon's row and marks it busy when it takes work. That part stays in this one
statement rather than moving to fleet, because a claim's cost and its races rest on
it (a drop, a scale-down or a second claim of the same daemon waits on that lock, and
sees the busy mark when it gets it; a separate statement would open a window between
them and cost every claim a round trip). The table's name comes from the model that
owns it, so the dependency shows in the imports and follows the model."""

from django.conf import settings
from django.db import connection

from fleet.models import Daemon
from jobs.models import Invocation
from jobs.transitions.states import QUEUED, STATE_PARAMS
from lakeshore_admin import metrics
from lakeshore_admin.rows import model_rows

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
_DAEMONS = Daemon._meta.db_table
_CLAIM_SQL = """
WITH me AS (
    SELECT id, state FROM {daemons}
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
    UPDATE {daemons} d SET state = %(busy)s, updated_at = now()
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
        daemons=_DAEMONS,
        order=sql_order,
        extra=f"{extra} {_BOUNDS[order]}",
        sizes=_SIZES if sized else "",
        sized_head=_SIZED_HEAD if sized else "",
        sized_tail=_SIZED_TAIL.format(order=sql_order) if sized else "",
    )
    rows = sorted(model_rows(Invocation, sql, {**STATE_PARAMS, **params}), key=key)
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
