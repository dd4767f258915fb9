"""nothing → queued: a submit's INSERTs, a batch's in one statement, the fast path of a
single submit into a queue that admits it, and the retries of ended invocations."""

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection

from jobs import serving
from jobs.models import Invocation
from jobs.transitions.states import STATE_PARAMS
from lakeshore_admin.rows import model_rows

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
    return model_rows(Invocation, _INSERT_SQL, {**STATE_PARAMS, **params})


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
RETURNING *, """ + serving.columns("%(queue)s::text")  # noqa: S608 - constants only


SERVING_COLUMNS = ("serving_live", "serving_starts")


def insert_if_admitted(item: dict, *, admitting: list[str]) -> Invocation | None:
    """The fast path of a submit: the new queued invocation, or None when the queue is
    missing, not admitting, bounded, or the key is taken (the caller then looks why).
    The row also says whether its queue is served (jobs/serving.py), in the same
    statement: `serving_live` and `serving_starts`."""
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
    rows = model_rows(
        Invocation,
        _INSERT_ADMITTED_SQL,
        {**STATE_PARAMS, **serving.PARAMS, **params},
        prepared=True,
        extras=SERVING_COLUMNS,
    )
    return rows[0] if rows else None


# An ended invocation queued again as a new one that names it (`retry_of`): the same
# function, arguments (JSON or the SDK's blob), priority, time limit, attempts and
# run_config, in the same queue, with no key; one statement for many.
_RETRY_SQL = """
INSERT INTO jobs_invocation (queue, function, args, kwargs, priority, state, attempts,
                             max_attempts, timeout_s, key, reason, error, created_at,
                             wire, args_blob, run_config, retry_of_id)
SELECT old.queue, old.function, old.args, old.kwargs, old.priority, %(queued)s, 0,
       old.max_attempts, old.timeout_s, '', '', '', now(),
       old.wire, old.args_blob, old.run_config, old.id
  FROM jobs_invocation old
 WHERE old.id = ANY(%(ids)s::bigint[])
 ORDER BY old.id
RETURNING id, queue, retry_of_id
"""


def insert_retries(ids: list[int]) -> list[tuple[int, str, int]]:
    """A retry of each of `ids` (the caller has locked them and checked that none was
    retried): (new id, queue, retried id) of each."""
    if not ids:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_RETRY_SQL, {**STATE_PARAMS, "ids": ids})
        return cursor.fetchall()
