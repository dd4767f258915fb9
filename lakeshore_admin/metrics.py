"""GET /metrics: Prometheus's text format, written by prometheus_client.

Two kinds of figures:

- What happened: invocations claimed and ended, how long they waited and ran, the
  controller's actions. Counted where the state changes (jobs/transitions.py,
  queues/controller.py) through the helpers below, from what the statements already
  return (no query of their own), and only once the transaction commits: a rolled-back
  change counts nothing. Every server process counts (gunicorn's workers, the Celery
  worker that runs the reaper and the controller), so prometheus_client runs in its
  multiprocess mode: each process writes its figures to files of its own under
  PROMETHEUS_MULTIPROC_DIR (settings.py sets it, before anything imports
  prometheus_client) and a scrape adds up the files of every process, live or gone.
  Whichever worker serves the scrape, the totals are the same. `make run` empties the
  directory when it starts: its counters start from zero, as after any restart.
- What is there now, per queue: pending, running, daemons by state, desired,
  utilization, the oldest pending invocation's age. Read from the database at scrape
  time (QueueCollector), in three statements whatever the number of queues.
"""

from collections import Counter as Tally
from collections.abc import Iterable, Sequence
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.http import HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.core import GaugeMetricFamily
from rest_framework.permissions import AllowAny
from rest_framework.views import APIView

from accounts.permissions import ReadOrOperate

if not values.ValueClass._multiprocess:
    raise ImproperlyConfigured(
        "prometheus_client was imported before the settings set PROMETHEUS_MULTIPROC_DIR: "
        "its counters would be per process. Import the Django settings first."
    )

# Seconds, from a fast claim to a day-long backlog or job.
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)

# registry=None: a scrape reads these from the processes' files (MultiProcessCollector),
# never from this process's memory.
ENDED = Counter(
    "lakeshore_invocations_ended",
    "Invocations that reached a final state (succeeded, failed, timeout, killed); a "
    "requeue is not an end.",
    ["queue", "state"],
    registry=None,
)
CLAIMED = Counter(
    "lakeshore_invocations_claimed",
    "Invocations handed to a daemon by a claim (one per attempt).",
    ["queue"],
    registry=None,
)
QUEUE_WAIT = Histogram(
    "lakeshore_invocation_queue_wait_seconds",
    "From submit (created_at) to the claim that handed the invocation to a daemon.",
    ["queue"],
    buckets=DURATION_BUCKETS,
    registry=None,
)
RUN_TIME = Histogram(
    "lakeshore_invocation_run_seconds",
    "From the claim (started_at) to the end (finished_at), for invocations that ended "
    "after running.",
    ["queue"],
    buckets=DURATION_BUCKETS,
    registry=None,
)
CONTROLLER_ACTIONS = Counter(
    "lakeshore_controller_actions",
    "The elasticity controller's events, by action (scale_up, scale_down, hold, "
    "launch_failed, tick_failed, tick_noop, ...).",
    ["queue", "action"],
    registry=None,
)


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


# ---------------------------------------------------------------------------- counting
# Called inside the statement's transaction; the figures are written after it commits.
# robust: a metrics file that cannot be written is logged, never the caller's error.


def claimed(invocations: Sequence) -> None:
    """Invocations a claim statement just set running (its RETURNING rows)."""
    if not invocations:
        return
    waits = [(row.queue, _seconds(row.created_at, row.started_at)) for row in invocations]

    def count() -> None:
        for queue, n in Tally(queue for queue, _ in waits).items():
            CLAIMED.labels(queue).inc(n)
        for queue, wait in waits:
            if wait is not None:
                QUEUE_WAIT.labels(queue).observe(wait)

    transaction.on_commit(count, robust=True)


def ended(rows: Iterable[tuple]) -> None:
    """Invocations a statement just ended: (queue, state, started_at, finished_at) each.
    started_at is None for one that never ran (killed while queued): counted, no run
    time."""
    rows = [
        (queue, str(state), _seconds(started, finished)) for queue, state, started, finished in rows
    ]
    if not rows:
        return

    def count() -> None:
        for (queue, state), n in Tally((queue, state) for queue, state, _ in rows).items():
            ENDED.labels(queue, state).inc(n)
        for queue, _, ran in rows:
            if ran is not None:
                RUN_TIME.labels(queue).observe(ran)

    transaction.on_commit(count, robust=True)


def killed_queued(counts: Iterable[tuple[str, int]]) -> None:
    """(queue, how many) killed while queued, from a statement that returns counts."""
    counts = [(queue, n) for queue, n in counts if n]
    if not counts:
        return

    def count() -> None:
        for queue, n in counts:
            ENDED.labels(queue, "killed").inc(n)

    transaction.on_commit(count, robust=True)


def controller_acted(event) -> None:
    """A QueueEvent the controller just wrote."""
    queue, action = event.queue.name, str(event.action)
    transaction.on_commit(lambda: CONTROLLER_ACTIONS.labels(queue, action).inc(), robust=True)


# ---------------------------------------------------------------------------- gauges


def _statement_time():
    """Now by the database's clock (as created_at was written), at this statement even
    inside a longer transaction."""
    from django.db.models import DateTimeField, Func

    return Func(
        function="statement_timestamp",
        template="statement_timestamp()",
        output_field=DateTimeField(),
    )


class QueueCollector:
    """Each queue's signals now, from the database, at scrape time: one read of the
    queues (with their capped pending count, oldest pending invocation and latest
    decision), one grouped read of running invocations, one of live daemons; the same
    rules as the queue's stats (queues/samples.py reads them in bulk for the charts).

    desired: for a queue with elasticity, what the controller's latest tick decided
    (the `desired` of its latest tick_noop, hold, scale_up or scale_down event, at most
    a tick old; absent before its first tick); for any other queue, what
    controller.plan says from the signals alone (the live count; 0 when archived)."""

    def collect(self):
        from django.db.models import DateTimeField, OuterRef, Subquery

        from jobs.models import Invocation, InvocationState
        from queues import controller, elasticity, samples
        from queues.models import (
            LIVE_DAEMON_STATES,
            DaemonState,
            EventAction,
            Queue,
            QueueEvent,
            QueueState,
        )
        from queues.services import PENDING_CAP

        oldest = (
            Invocation.objects.filter(queue=OuterRef("name"), state=InvocationState.QUEUED)
            .order_by("id")
            .values("created_at")[:1]
        )
        decisions = [
            EventAction.TICK_NOOP,
            EventAction.HOLD,
            EventAction.SCALE_UP,
            EventAction.SCALE_DOWN,
        ]
        decided = (
            QueueEvent.objects.filter(queue=OuterRef("pk"), action__in=decisions)
            .order_by("-at", "-id")
            .values("desired")[:1]
        )
        queues = list(
            Queue.objects.order_by("name").annotate(
                metrics_pending=samples.capped_queued(),
                metrics_oldest_age=_statement_time()
                - Subquery(oldest, output_field=DateTimeField()),
                metrics_decided=Subquery(decided),
            )
        )
        names = [queue.name for queue in queues]
        running = samples.running_counts(names)
        live = samples.live_daemons(names)

        def family(name: str, text: str, labels=("queue",)) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"lakeshore_queue_{name}", text, labels=list(labels))

        info = family("info", "Always 1: the queue and its state.", ("queue", "state"))
        pending = family(
            "pending", f"Queued invocations (counted up to {PENDING_CAP + 1}, like its stats)."
        )
        working = family("running", "Running invocations.")
        daemons = family("daemons", "Live daemons by state.", ("queue", "state"))
        desired = family(
            "desired_daemons",
            "Daemons the controller wants: its latest decision for a queue with elasticity, "
            "else the live count (0 when archived).",
        )
        utilization = family(
            "utilization", "Busy daemons / (provisioning + idle + busy); 0 when there are none."
        )
        age = family(
            "oldest_pending_age_seconds", "Age of the oldest queued invocation (0 when none)."
        )
        for queue in queues:
            counts = live.get(queue.name, {})
            signals = elasticity.Signals(
                daemons=sum(counts.get(state, 0) for state in samples.WORKING),
                busy=counts.get(DaemonState.BUSY, 0),
                pending=queue.metrics_pending,
            )
            if queue.elasticity_kind and queue.state != QueueState.ARCHIVED:
                wanted = queue.metrics_decided
            else:  # plan answers these from the signals alone, without a query
                wanted = controller.plan(queue, signals).desired
            name = [queue.name]
            info.add_metric([queue.name, str(queue.state)], 1)
            pending.add_metric(name, signals.pending)
            working.add_metric(name, running.get(queue.name, 0))
            for state in LIVE_DAEMON_STATES:
                daemons.add_metric([queue.name, str(state)], counts.get(state, 0))
            if wanted is not None:
                desired.add_metric(name, wanted)
            utilization.add_metric(name, signals.utilization)
            oldest_age = queue.metrics_oldest_age
            age.add_metric(name, oldest_age.total_seconds() if oldest_age else 0.0)
        yield from (info, pending, working, daemons, desired, utilization, age)


# ---------------------------------------------------------------------------- the view


def render() -> bytes:
    """The text of a scrape: every process's counters and histograms, and the gauges."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(QueueCollector())
    return generate_latest(registry)


class MetricsView(APIView):
    """The scrape, behind the API's authentication: a read role (viewer or operator)."""

    permission_classes = [ReadOrOperate]

    def get(self, request):
        return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)


_private = MetricsView.as_view()
_public = MetricsView.as_view(permission_classes=[AllowAny], authentication_classes=[])


def metrics_view(request, *args, **kwargs):
    """GET /metrics. Open to anyone when LAKESHORE_METRICS_PUBLIC is on (read at each
    request); otherwise 401 without credentials, 403 without a read role."""
    view = _public if settings.LAKESHORE_METRICS_PUBLIC else _private
    return view(request, *args, **kwargs)
