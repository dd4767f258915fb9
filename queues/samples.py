"""A small time series of each queue's signals (QueueSample), for the console's charts.

The rule lives here once: **at most one sample per queue per minute**, `at` being the
minute's start. The controller's tick calls `record` with the events it just wrote;
every queue that is not archived (and any archived one the controller still ticks) gets
a sample, whether the controller manages it or not:

- a queue the tick decided for: D, B, P, U and desired are the event's (what the
  controller saw and wanted), nothing is read again;
- any other queue: D and B from one grouped query over live daemons, P from a capped
  count (like `queue_signals`), desired as `controller.plan` says it for a queue
  without elasticity (the live count), or, for a managed queue this tick skipped
  (another tick held it, or it is backing off), the desired of its latest event.

Running, which events do not hold, comes from one grouped query for every queue.

A tick costs the same statements for 1 queue or 1,000: one read of the queues still
unsampled this minute (with their pending counts), one grouped read of running
invocations, at most one grouped read of daemons, and one INSERT … ON CONFLICT DO
NOTHING for all of them. Later ticks in the same minute find nothing unsampled and
stop after the first read. Two ticks at once insert each row once.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import (
    Case,
    CharField,
    Count,
    DateTimeField,
    Exists,
    F,
    Func,
    IntegerField,
    Max,
    OuterRef,
    Q,
    Subquery,
    Value,
    When,
)
from django.utils import timezone

from fleet.models import Daemon, DaemonState
from jobs.models import Invocation, InvocationState
from queues import elasticity, services
from queues.models import Queue, QueueEvent, QueueSample, QueueState

PERIOD = timedelta(minutes=1)

# The ranges the charts show, and the bucket each point stands for (a day at one point a
# minute would be 1,440 points a line; five minutes makes 288).
RANGES: dict[str, tuple[timedelta, timedelta]] = {
    "hour": (timedelta(hours=1), timedelta(minutes=1)),
    "day": (timedelta(days=1), timedelta(minutes=5)),
}
DEFAULT_RANGE = "hour"
BUCKET_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)  # fixed: a bucket keeps its points
SPARKLINE_SPAN = timedelta(hours=1)


def minute_of(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def capped_queued():
    """The queue's queued invocations, counted up to services.PENDING_CAP + 1 ("more"), as a
    subquery that reads the partial index of queued rows (a backlog may be millions)."""

    rows = Invocation.objects.filter(queue=OuterRef("name"), state=InvocationState.QUEUED)
    rows = rows.order_by()
    return Func(
        Subquery(rows.values("id")[: services.PENDING_CAP + 1]),
        template="(SELECT COUNT(*) FROM %(expressions)s AS capped)",
        output_field=IntegerField(),
    )


# The default queue ('', no row: its samples have queue None) as a row of the same
# columns, unless it was sampled this minute: it has no elasticity, so no last desired.
_DEFAULT_UNSAMPLED = """
(SELECT NULL::bigint, ''::varchar,
        (SELECT COUNT(*) FROM (SELECT id FROM jobs_invocation
                                WHERE queue = '' AND state = %s LIMIT %s) AS capped),
        NULL::int
  WHERE NOT EXISTS (SELECT 1 FROM queues_queuesample WHERE queue_id IS NULL AND at = %s))
"""

_INSERT_SQL = """
INSERT INTO queues_queuesample
       (queue_id, at, pending, running, daemons, busy, desired, utilization)
SELECT queue_id, %(at)s, pending, running, daemons, busy, desired, utilization
  FROM unnest(%(queue)s::bigint[], %(pending)s::int[], %(running)s::int[],
              %(daemons)s::int[], %(busy)s::int[], %(desired)s::int[],
              %(utilization)s::float8[])
       AS s(queue_id, pending, running, daemons, busy, desired, utilization)
ON CONFLICT (queue_id, at) DO NOTHING
"""


def record(*, now: datetime | None = None, events: Iterable[QueueEvent] = ()) -> int:
    """Sample every queue not yet sampled this minute; `events` are the decisions the
    tick just wrote (their signals are reused). Returns the number of rows written."""
    minute = minute_of(now or timezone.now())
    decided = {event.queue_id: event for event in events}
    fresh = ~Q(pk__in=list(decided))  # queues whose signals this function reads itself
    last_desired = (
        QueueEvent.objects.filter(queue=OuterRef("pk")).order_by("-at", "-id").values("desired")
    )
    named = (
        Queue.objects.filter(~Q(state=QueueState.ARCHIVED) | Q(pk__in=list(decided)))
        .exclude(Exists(QueueSample.objects.filter(queue=OuterRef("pk"), at=minute)))
        .order_by()
        .annotate(
            fresh_pending=Case(When(fresh, then=capped_queued()), default=None),
            last_desired=Case(
                When(fresh & ~Q(elasticity_kind=""), then=Subquery(last_desired[:1])),
                default=None,
            ),
        )
        .values_list("pk", "name", "fresh_pending", "last_desired")
    )
    sql, params = named.query.sql_with_params()
    with connection.cursor() as cursor:  # and the default queue's, in the same statement
        cursor.execute(
            f"{_DEFAULT_UNSAMPLED} UNION ALL ({sql})",
            [str(InvocationState.QUEUED), services.PENDING_CAP + 1, minute, *params],
        )
        rows = cursor.fetchall()
    if not rows:
        return 0
    running = running_counts([name for _, name, *_ in rows])
    live = live_daemons([name for pk, name, *_ in rows if pk not in decided])
    keys = ("queue", "pending", "running", "daemons", "busy", "desired", "utilization")
    columns: dict[str, list] = {key: [] for key in keys}
    for pk, name, pending, desired in rows:
        event = decided.get(pk)
        if event is not None:
            signals = elasticity.Signals(
                daemons=event.daemons, busy=event.busy, pending=event.pending
            )
            desired = event.desired
        else:
            counts = live.get(name, {})
            working = sum(counts.get(s, 0) for s in WORKING)
            signals = elasticity.Signals(
                daemons=working, busy=counts.get(DaemonState.BUSY, 0), pending=pending
            )
            desired = working if desired is None else desired
        columns["queue"].append(pk)
        columns["pending"].append(signals.pending)
        columns["running"].append(running.get(name, 0))
        columns["daemons"].append(signals.daemons)
        columns["busy"].append(signals.busy)
        columns["desired"].append(desired)
        columns["utilization"].append(round(signals.utilization, 4))
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_SQL, {"at": minute, **columns})
        return cursor.rowcount


WORKING = (DaemonState.PROVISIONING, DaemonState.IDLE, DaemonState.BUSY)


def running_counts(names: list[str]) -> dict[str, int]:
    """Running invocations by queue, for all `names` in one grouped query (running rows
    are few: at most the daemons' slots), capped like the queue page's count."""

    rows = (
        Invocation.objects.filter(state=InvocationState.RUNNING, queue__in=names)
        .order_by()
        .values_list("queue")
        .annotate(n=Count("*"))
    )
    return {queue: min(n, services.PENDING_CAP + 1) for queue, n in rows}


# Each queue a daemon serves; '' (the default queue) for one that subscribes to none.
_SERVED = (
    "unnest(CASE WHEN cardinality(%(expressions)s) = 0 THEN ARRAY['']::varchar[]"
    " ELSE %(expressions)s END)"
)


def live_daemons(names: list[str]) -> dict[str, dict[str, int]]:
    """Live daemons by queue name and state, for all `names` ('' is the default queue)
    in one grouped query."""
    counts: dict[str, dict[str, int]] = {}
    if not names:
        return counts
    wanted = set(names)
    serving = Daemon.objects.live().subscribed_to_any([name for name in wanted if name])
    if "" in wanted:  # the default queue's daemons subscribe to none
        serving = serving | Daemon.objects.live().filter(queues=[])
    rows = (
        serving.order_by()
        .annotate(
            served=Func(F("queues"), function="unnest", template=_SERVED, output_field=CharField())
        )
        .values_list("served", "state")
        .annotate(n=Count("*"))
    )
    for served, state, n in rows:
        if served in wanted:
            counts.setdefault(served, {})[state] = n
    return counts


# ---------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Point:
    at: datetime  # the bucket's start
    pending: int
    running: int
    daemons: int
    desired: int


def chart_range(value: str | None) -> str:
    """The `?range=` of a chart: hour or day; anything else is the hour."""
    return value if value in RANGES else DEFAULT_RANGE


def series(queue: Queue, range_name: str, *, now: datetime | None = None) -> list[Point]:
    """A queue's samples over the range, one point per bucket (the highest value of
    each signal in it, so a short peak still shows), oldest first: one query."""
    span, bucket = RANGES[chart_range(range_name)]
    now = now or timezone.now()
    since = minute_of(now) - span
    binned = Func(
        Value(bucket),
        F("at"),
        Value(BUCKET_ORIGIN),
        function="date_bin",
        output_field=DateTimeField(),
    )
    rows = (
        QueueSample.objects.filter(queue=queue if queue.pk else None, at__gt=since)
        .order_by()
        .annotate(bucket=binned)
        .values("bucket")
        .annotate(
            pending_max=Max("pending"),
            running_max=Max("running"),
            daemons_max=Max("daemons"),
            desired_max=Max("desired"),
        )
        .order_by("bucket")
    )
    return [
        Point(r["bucket"], r["pending_max"], r["running_max"], r["daemons_max"], r["desired_max"])
        for r in rows
    ]


def recent_pending(
    queue_ids: list[int], *, now: datetime | None = None
) -> dict[int, list[tuple[datetime, int]]]:
    """Pending over the last hour for the queues of one page, in one query:
    {queue id (None: the default queue): [(minute, pending), …] oldest first}."""
    found: dict[int, list[tuple[datetime, int]]] = {pk: [] for pk in queue_ids}
    if not queue_ids:
        return found
    since = minute_of(now or timezone.now()) - SPARKLINE_SPAN
    ids = Q(queue_id__in=[pk for pk in queue_ids if pk is not None])
    if None in found:
        ids |= Q(queue__isnull=True)  # the default queue's
    rows = (
        QueueSample.objects.filter(ids, at__gt=since)
        .order_by("queue_id", "at")
        .values_list("queue_id", "at", "pending")
    )
    for queue_id, at, pending in rows:
        found[queue_id].append((at, pending))
    return found
