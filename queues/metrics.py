"""GET /metrics: Prometheus's text format, written by prometheus_client.

Two kinds of figures:

- What happened (invocations claimed and ended, their waits and run times, the
  controller's actions): counted by the recorder, lakeshore_admin/metrics.py, in every
  server process, and added up in the database (MetricTotal). A scrape writes what its
  own process counted since its last flush (one statement, none when nothing), then
  reads the table (TotalsCollector: one statement, whatever the number of queues).
- What is there now, per queue: pending, running, daemons by state, desired,
  utilization, the oldest pending invocation's age. Read from the database at scrape
  time (QueueCollector), in three statements whatever the number of queues.
"""

from django.conf import settings
from django.db import connection
from django.db.models import DateTimeField, Func, OuterRef, Subquery
from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from rest_framework.permissions import AllowAny
from rest_framework.views import APIView

from accounts.permissions import ReadOrOperate
from fleet.models import LIVE_DAEMON_STATES, DaemonState
from jobs.models import Invocation, InvocationState
from lakeshore_admin import metrics
from queues import elasticity, samples
from queues.models import EventAction, MetricTotal, Queue, QueueEvent, QueueState
from queues.services import PENDING_CAP


def _statement_time():
    """Now by the database's clock (as created_at was written), at this statement even
    inside a longer transaction."""
    return Func(
        function="statement_timestamp",
        template="statement_timestamp()",
        output_field=DateTimeField(),
    )


COLUMNS = (
    "name",
    "state",
    "elasticity_kind",
    "metrics_pending",
    "metrics_oldest_age",
    "metrics_decided",
)
# The default queue ('') as a row of the same columns: it has no Queue row, is always
# active and has no elasticity (its desired count is the live count).
_DEFAULT_ROW = """
(SELECT ''::varchar, 'active'::varchar, ''::varchar,
        (SELECT COUNT(*) FROM (SELECT id FROM jobs_invocation
                                WHERE queue = '' AND state = %s LIMIT %s) AS capped),
        statement_timestamp() - (SELECT created_at FROM jobs_invocation
                                  WHERE queue = '' AND state = %s ORDER BY id LIMIT 1),
        NULL::int)
"""


def _row(values: tuple) -> Queue:
    """A row of the scrape's read as an unsaved Queue (controller.plan reads it)."""
    name, state, elasticity_kind, *figures = values
    queue = Queue(name=name, state=state, elasticity_kind=elasticity_kind)
    queue.metrics_pending, queue.metrics_oldest_age, queue.metrics_decided = figures
    return queue


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
        named = (
            Queue.objects.order_by("name")
            .annotate(
                metrics_pending=samples.capped_queued(),
                metrics_oldest_age=_statement_time()
                - Subquery(oldest, output_field=DateTimeField()),
                metrics_decided=Subquery(decided),
            )
            .values_list(*COLUMNS)
        )
        sql, params = named.query.sql_with_params()
        with connection.cursor() as cursor:  # the default queue first, in the same statement
            cursor.execute(
                f"{_DEFAULT_ROW} UNION ALL ({sql})",
                [
                    str(InvocationState.QUEUED),
                    PENDING_CAP + 1,
                    str(InvocationState.QUEUED),
                    *params,
                ],
            )
            queues = [_row(row) for row in cursor.fetchall()]
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
                wanted = elasticity.plan(queue, signals).desired
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


class TotalsCollector:
    """The counters and histograms: every process's totals, from the database, after
    this process's own last counts (so a scrape shows at least everything its own
    process counted before it)."""

    def collect(self):
        metrics.flush()
        yield from metrics.families(MetricTotal.objects.values_list("name", "labels", "value"))


# ---------------------------------------------------------------------------- the view


def render() -> bytes:
    """The text of a scrape: every process's counters and histograms, and the gauges."""
    registry = CollectorRegistry()
    registry.register(TotalsCollector())
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
