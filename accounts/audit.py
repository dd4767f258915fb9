"""The audit trail: every operator action, whichever door it came through (the API, the
CLI, the console, Django admin), is one AuditEvent row naming who did it and how.

The services record it (one call next to the change they make, so no door can skip
it); who and how come from the request being served, which AuditMiddleware keeps in a
context variable for the services to read: the API's token user (DRF sets it on the
request as it authenticates), the console's or admin's session user. Work with no
request behind it (Celery, tests) is the system's; a management command's is named after
it (`command`)."""

import contextlib
import contextvars

from django.db import connection, models
from django.utils.dateparse import parse_datetime

from accounts.models import AuditEvent
from queues.models import EventAction

_request: contextvars.ContextVar = contextvars.ContextVar("lakeshore_request", default=None)
_command: contextvars.ContextVar = contextvars.ContextVar("lakeshore_command", default=None)

CLI_AGENT = "lakeshore-cli/"  # the CLI's User-Agent (lakeshore/client.py)


class Via(models.TextChoices):
    API = "api"
    CLI = "cli"
    CONSOLE = "console"
    ADMIN = "admin"
    SYSTEM = "system"


def actor_and_via(request=None) -> tuple[str, str]:
    """(who, how) for the request being served, or the system's."""
    request = request if request is not None else _request.get()
    if request is None:
        command = _command.get()
        return (f"manage.py {command}" if command else "system"), Via.SYSTEM
    user = getattr(request, "user", None)
    who = user.get_username() if user is not None and user.is_authenticated else "anonymous"
    path = request.path
    if path.startswith("/api/"):
        agent = request.headers.get("User-Agent", "")
        via = Via.CLI if agent.startswith(CLI_AGENT) else Via.API
    elif path.startswith("/admin/"):
        via = Via.ADMIN
    else:
        via = Via.CONSOLE
    return who, via


def record(action: str, *, queue: str = "", target: str = "", summary: str = "", detail=None):
    """One audit row for an action that just happened (in the caller's transaction, if
    any: an action rolled back leaves no row)."""

    who, via = actor_and_via()
    return AuditEvent.objects.create(
        actor=who,
        via=via,
        action=action,
        queue=queue or "",
        target=target,
        summary=summary[:500],
        detail=detail if detail is not None else {},
    )


@contextlib.contextmanager
def command(name: str):
    """While it lasts, record() names this management command (manage.py NAME) as who
    acted, through the system's door."""
    token = _command.set(name)
    try:
        yield
    finally:
        _command.reset(token)


def serving_request():
    """The request being served (serving, AuditMiddleware), or None."""
    return _request.get()


@contextlib.contextmanager
def serving(request):
    """While it lasts, record() names this request's user and door."""
    token = _request.set(request)
    try:
        yield
    finally:
        _request.reset(token)


class AuditMiddleware:
    """Keeps the request being served where record() finds it."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        with serving(request):
            return self.get_response(request)


# ---------------------------------------------------------------------------- the timeline

TIMELINE_PAGE = 50
DECISION = "decision"  # a controller decision (queues.QueueEvent)
ACTION = "action"  # an operator action (AuditEvent)

# Each side is read along its own index, at most a page of it, then the two are merged:
# a page costs two index scans, at any depth. The key is a row's (at, kind, id): older
# than it (newest first, `<`, DESC) or newer than it (oldest first, `>`, ASC).
_TIMELINE_SQL = """
WITH decisions AS (
    SELECT 'decision'::text AS kind, e.id, e.at, q.name AS queue, e.action::text AS action,
           'controller'::text AS actor, 'controller'::text AS via, e.reason AS summary,
           ''::text AS target, e.daemons, e.busy, e.pending, e.utilization, e.desired,
           e.delta
      FROM queues_queueevent e JOIN queues_queue q ON q.id = e.queue_id
     WHERE %(decisions)s
       AND (%(noop)s OR e.action <> 'tick_noop')
       AND (%(queue)s::text IS NULL OR q.name = %(queue)s::text)
       AND (%(action)s::text IS NULL OR e.action = %(action)s::text)
       AND (%(since)s::timestamptz IS NULL OR e.at >= %(since)s::timestamptz)
       AND (%(until)s::timestamptz IS NULL OR e.at < %(until)s::timestamptz)
       AND (%(c_at)s::timestamptz IS NULL
            OR (e.at, 'decision'::text, e.id) {cmp} (%(c_at)s::timestamptz, %(c_kind)s::text,
                                                 %(c_id)s::bigint))
     ORDER BY e.at {order}, e.id {order}
     LIMIT %(limit)s
), actions AS (
    SELECT 'action'::text AS kind, a.id, a.at, a.queue, a.action, a.actor, a.via,
           a.summary, a.target, NULL::integer, NULL::integer, NULL::integer,
           NULL::double precision, NULL::integer, NULL::integer
      FROM accounts_auditevent a
     WHERE %(actions)s
       AND (%(queue)s::text IS NULL OR a.queue = %(queue)s::text)
       AND (%(action)s::text IS NULL OR a.action = %(action)s::text)
       AND (%(actor)s::text IS NULL OR a.actor = %(actor)s::text)
       AND (%(since)s::timestamptz IS NULL OR a.at >= %(since)s::timestamptz)
       AND (%(until)s::timestamptz IS NULL OR a.at < %(until)s::timestamptz)
       AND (%(c_at)s::timestamptz IS NULL
            OR (a.at, 'action'::text, a.id) {cmp} (%(c_at)s::timestamptz, %(c_kind)s::text,
                                               %(c_id)s::bigint))
     ORDER BY a.at {order}, a.id {order}
     LIMIT %(limit)s
)
SELECT * FROM (SELECT * FROM decisions UNION ALL SELECT * FROM actions) merged
 ORDER BY at {order}, kind {order}, id {order}
 LIMIT %(limit)s
"""
_OLDER_SQL = _TIMELINE_SQL.format(cmp="<", order="DESC")
_NEWER_SQL = _TIMELINE_SQL.format(cmp=">", order="ASC")
_COLUMNS = [
    "kind", "id", "at", "queue", "action", "actor", "via", "summary", "target",
    "daemons", "busy", "pending", "utilization", "desired", "delta",
]  # fmt: skip


def encode_cursor(row: dict) -> str:
    return f"{row['at'].isoformat()},{row['kind']},{row['id']}"


def decode_cursor(value: str):
    """(at, kind, id) from a cursor, or None for a missing or garbled one."""

    try:
        at, kind, pk = value.replace(" ", "+").rsplit(",", 2)  # a '+' read as a space
        parsed, number = parse_datetime(at), int(pk)
        if parsed is None or kind not in (DECISION, ACTION) or not 0 < number < 2**63:
            return None
        return parsed, kind, number
    except (ValueError, AttributeError):
        return None


def timeline(
    *,
    queue: str | None = None,
    action: str | None = None,
    actor: str | None = None,
    since=None,
    until=None,
    noop: bool = False,
    cursor: str = "",
    limit: int = TIMELINE_PAGE,
) -> tuple[list[dict], str | None]:
    """One timeline across queues: the controller's decisions (actor 'controller') and
    every operator action, newest first, `limit` a page. Returns (rows, next cursor or
    None). tick_noop decisions only with `noop`."""

    filters = {"queue": queue, "action": action, "actor": actor}
    filters |= {"since": since, "until": until, "noop": noop}
    rows = timeline_rows(filters, older_than=cursor, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (encode_cursor(rows[-1]) if more and rows else None)


def timeline_rows(filters: dict, *, older_than="", newer_than="", limit: int) -> list[dict]:
    """Up to `limit` rows of the timeline (newest first) older than one cursor, or the
    `limit` rows just newer than the other; `filters` are timeline()'s."""

    after = decode_cursor(newer_than or older_than) if newer_than or older_than else None
    actor = filters.get("actor")
    params = {
        "decisions": actor in (None, "controller"),
        "actions": actor != "controller",
        "noop": bool(filters.get("noop")),
        "queue": filters.get("queue"),
        "action": filters.get("action"),
        "actor": actor,
        "since": filters.get("since"),
        "until": filters.get("until"),
        "c_at": after[0] if after else None,
        "c_kind": after[1] if after else None,
        "c_id": after[2] if after else None,
        "limit": limit,
    }
    with connection.cursor() as db:
        db.execute(_NEWER_SQL if newer_than and after else _OLDER_SQL, params)
        rows = [dict(zip(_COLUMNS, values, strict=True)) for values in db.fetchall()]
    for row in rows:  # what the pages ask of a row, said once
        row["is_decision"] = row["kind"] == DECISION
    return rows[::-1] if newer_than and after else rows


def known_actions() -> list[str]:
    """The action names the timeline may hold, for its filter."""

    operator = [
        "queue.create", "queue.patch", "queue.drain", "queue.pause", "queue.resume",
        "queue.archive", "queue.unarchive", "queue.remove", "provider.create",
        "provider.patch", "provider.remove", "daemon.drop", "job.kill", "job.retry",
        "jobs.bulk_cancel", "jobs.bulk_retry", "token.create", "token.revoke",
        "role.grant",
    ]  # fmt: skip
    return [*EventAction.values, *operator]
