"""Console pages (HTML). The lists use the same FilterSet and QuerySet as the API."""

import logging
from datetime import timedelta

from django.contrib import messages
from django.db.models import Count, DateTimeField, Func, IntegerField, OuterRef, Subquery
from django.http import Http404, HttpResponse, HttpResponseServerError
from django.shortcuts import redirect, render
from django.template import loader
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import requires_csrf_token
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts import audit
from accounts.console_access import console_view
from accounts.roles import can_operate, roles_of
from fleet.models import Daemon, DaemonState
from jobs import insight
from jobs.models import Invocation, InvocationState
from lakeshore_admin.errors import DomainError
from lakeshore_admin.lists import ConsoleListView
from queues import charts, samples, services
from queues.filters import QueueFilter
from queues.forms import QueueCreateForm, QueueEditForm
from queues.models import Queue, QueueState
from queues.samples import live_daemons
from queues.services import PENDING_CAP

log = logging.getLogger(__name__)

PAGE_SIZE = 100


def with_backlog(queues):
    """Pending (capped at PENDING_CAP, like the queue page) and when the oldest queued
    invocation was submitted, in the page's own query. Per queue, both read the partial
    index of queued rows, inv_queued_fifo (queue, id) WHERE state = 'queued': the count
    from the index alone, the oldest as the lowest id (ids follow submit order; a
    requeued or retried invocation keeps its id and its created_at)."""

    queued = Invocation.objects.filter(
        queue=OuterRef("name"), state=InvocationState.QUEUED
    ).order_by()
    return queues.annotate(
        pending=Func(
            Subquery(queued.values("id")[: PENDING_CAP + 1]),
            template="(SELECT COUNT(*) FROM %(expressions)s AS capped)",
            output_field=IntegerField(),
        ),
        oldest_queued_at=Subquery(
            queued.order_by("id").values("created_at")[:1], output_field=DateTimeField()
        ),
    )


FAILED_WINDOW = timedelta(hours=24)
SUCCEEDED_WINDOW = timedelta(hours=1)


def add_activity(queues: list[Queue], *, now=None) -> None:
    """Running, succeeded in the last hour, failed in the last 24 h, and live daemons busy
    and idle, for the queues of one page: four grouped queries whatever the number of
    queues. Running reads the partial index of running rows (inv_running_daemon),
    succeeded the index of what each queue finished by time (inv_finished), failed the
    index of failures by time (inv_failures)."""

    now = now or timezone.now()
    names = [queue.name for queue in queues]
    running, failed, succeeded, daemons = {}, {}, {}, {}
    if names:
        running = dict(
            Invocation.objects.filter(state=InvocationState.RUNNING, queue__in=names)
            .order_by()
            .values_list("queue")
            .annotate(n=Count("*"))
        )
        failed = dict(
            Invocation.objects.filter(
                state=InvocationState.FAILED,
                finished_at__gte=now - FAILED_WINDOW,
                queue__in=names,
            )
            .order_by()
            .values_list("queue")
            .annotate(n=Count("*"))
        )

        succeeded = dict(
            Invocation.objects.filter(
                state=InvocationState.SUCCEEDED,
                finished_at__gte=now - SUCCEEDED_WINDOW,
                queue__in=names,
            )
            .order_by()
            .values_list("queue")
            .annotate(n=Count("*"))
        )
        for served, states in live_daemons(names).items():
            for state, n in states.items():
                daemons[served, state] = n
    for queue in queues:
        if queue.is_default:  # live daemons subscribed to no queue
            queue.members = sum(n for (name, _), n in daemons.items() if name == "")
        queue.running = running.get(queue.name, 0)
        queue.failed_recently = failed.get(queue.name, 0)
        queue.succeeded_recently = succeeded.get(queue.name, 0)
        queue.busy = daemons.get((queue.name, DaemonState.BUSY), 0)
        queue.idle = daemons.get((queue.name, DaemonState.IDLE), 0)
        queue.pending_capped = queue.pending > PENDING_CAP
        queue.pending = min(queue.pending, PENDING_CAP)
        oldest = queue.oldest_queued_at
        queue.oldest_wait = "-" if oldest is None else short_age(now - oldest)


def short_age(delta: timedelta) -> str:
    """An age as the console shows it: '40 s', '3 min', '5 h', '2 d' (rounded down)."""
    seconds = max(0, int(delta.total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def add_sparklines(queues: list[Queue], *, now=None) -> None:
    """Pending over the last hour, as a sparkline, for the queues of one page: one query
    (queues/charts.py draws it from the samples the controller's tick records)."""

    drawn = charts.pending_sparklines(queues, now=now)
    for queue in queues:
        queue.sparkline = drawn.get(queue.pk)


@method_decorator([require_GET, console_view], name="dispatch")
class QueueListPage(ConsoleListView):
    """The queues, by name, with what each holds and does now (the console's home)."""

    template_name = "queues/queue_list.html"
    table_id = "queue-table"
    filterset_class = QueueFilter
    ordering = "name"
    page_size = PAGE_SIZE
    filter_look = {"state": {"label": "State", "empty_label": "active, draining, paused"}}

    above_table = True  # "no named queue yet" when the default queue is all there is

    def get_queryset(self):
        return with_backlog(Queue.objects.for_list())

    def page(self, source) -> dict:
        """The default queue first, on the first page only, when the state filter lets
        active queues in (it is always active). The pager does not count it."""
        found = super().page(source)
        state = self.filterset.form.cleaned_data.get("state")
        first = found["previous_url"] is None and found["first_url"] is None
        first = first and not any(page["current"] for page in found["pages"][1:])
        if first and state in (None, "", QueueState.ACTIVE):
            found["rows"] = [default_queue_row(), *found["rows"]]
            found["named"] = len(found["rows"]) - 1
        return found

    def decorate(self, rows):
        add_activity(rows)
        add_sparklines(rows)

    def extra_context_data(self):
        found = {"can_act": can_operate(self.request.user)}
        if not self.table_only():  # the dashboard above refreshes itself (dashboard)
            found |= dashboard_context()
        return found


def dashboard_context() -> dict:
    """The fleet at a glance, above the queues on the home page: live daemons, what
    waits and runs, and what ended in the last hour (figures, panels, top errors)."""
    return {"fleet": services.fleet_stats(ended=False), **ended_context(None, "hour")}


@require_GET
@console_view
def dashboard(request):
    """The home page's dashboard alone: its own refresh."""
    return render(request, "queues/queue_list.html#dashboard", dashboard_context())


def default_queue_row() -> Queue:
    """The default queue as the list shows it: its pending count and oldest wait read
    like with_backlog's (the partial index of queued rows), its members counted by
    add_activity with the other live daemons."""
    queue = services.default_queue()
    queued = Invocation.objects.filter(queue="", state=InvocationState.QUEUED).order_by()
    queue.pending = queued.values("id")[: PENDING_CAP + 1].count()
    queue.oldest_queued_at = queued.order_by("id").values_list("created_at", flat=True).first()
    return queue


MEMBERS_SHOWN = 200
EVENTS_SHOWN = 20
ACTIONS = ["drain", "pause", "resume", "archive", "unarchive"]


def _members(queue: Queue) -> dict:
    """The queue's live member daemons, as its page lists them."""
    daemons = Daemon.objects.live().serving(queue.name).for_list().order_by("id")
    return {"members": list(daemons[:MEMBERS_SHOWN]), "members_shown": MEMBERS_SHOWN}


def _queue_shown(name: str, *, rows=Queue.objects) -> Queue:
    """The queue a page shows: by name, or the default queue at '(default)'."""
    if name == services.DEFAULT_LABEL:
        return services.default_queue()
    try:
        return rows.get(name=name)
    except Queue.DoesNotExist:
        raise Http404(f"Queue '{name}' does not exist.") from None


def _detail_context(request, name: str) -> dict:
    """The queue page's figures. The default queue's is read-only: it has no settings to
    edit and no state to change (no Edit, no actions)."""
    queue = _queue_shown(name, rows=Queue.objects.for_list())
    return {
        "queue": queue,
        "stats": services.queue_stats(queue, ended=False),
        **_members(queue),
        "events": audit.timeline(queue=queue.name, limit=EVENTS_SHOWN)[0],
        "can_act": can_operate(request.user) and not queue.is_default,
        "actions": [] if queue.is_default else services.queue_actions(queue),
    }


def ended_context(queue: str | None, range_name: str) -> dict:
    """What ended in the range's window, of one queue or every queue (None), as the
    queue page and the dashboard show it: the figures, two panels and the top errors."""
    span = charts.ended_window(range_name)
    return {
        "ended": insight.ended(queue=queue, span=span),
        "ended_panels": charts.ended_panels(queue, range_name),
        "errors_queue": queue,
        "span_text": charts.RANGE_TEXT[range_name],
        "ended_range": range_name,
    }


@require_GET
@console_view
def queue_detail(request, name: str):
    """The queue page; htmx asks for its parts: the summary and the member daemons
    (each refreshed every few seconds), the chart with its range switch, or the chart's
    figure (refreshed every minute). `?range=hour|day` picks the chart's range
    (anything else: the hour)."""

    template = "queues/queue_detail.html"
    target = request.htmx.target if request.htmx else None
    if target == "queue-summary":
        return render(request, template + "#queue-summary", _detail_context(request, name))
    range_name = samples.chart_range(request.GET.get("range"))
    if target == "queue-ended":
        queue = _queue_shown(name, rows=Queue.objects.only("pk", "name"))
        context = {"queue": queue, **ended_context(queue.name, range_name)}
        return render(request, template + "#queue-ended", context)
    if target in ("queue-members", "queue-chart", "queue-chart-figure"):
        queue = _queue_shown(name, rows=Queue.objects.only("pk", "name"))
        if target == "queue-members":
            return render(request, template + "#queue-members", {"queue": queue, **_members(queue)})
        context = {"queue": queue}
        template += f"#{target}"
    else:
        context = _detail_context(request, name)
        context |= ended_context(context["queue"].name, range_name)
    context["chart"] = charts.queue_chart(context["queue"], range_name)
    context["chart_ranges"] = list(samples.RANGES)
    return render(request, template, context)


@require_POST
@console_view
def queue_action(request, name: str, action: str):
    """drain, pause, resume, archive, unarchive from the console: the same service as
    the API. What happened (done, or refused and why) goes to the page's messages region,
    added to what is there (an htmx out-of-band swap), with the summary redrawn."""

    if action not in ACTIONS:
        raise Http404(f"No action '{action}'.")
    try:
        queue = services.queue_transition(name=name, action=action)
    except DomainError as exc:
        messages.error(request, f"Queue {name} was not changed: {exc.message}")
    else:
        messages.success(request, f"Queue {name}: {action} done; it is {queue.state} now.")
    if not request.htmx:
        return redirect("queues:detail", name=name)
    summary = render_to_string(
        "queues/queue_detail.html#queue-summary", _detail_context(request, name), request
    )
    said = render_to_string("console/messages_oob.html", {}, request)
    return HttpResponse(summary + said)


@require_http_methods(["GET", "POST"])
@console_view(operators_only=True)
def queue_add(request):
    """The create form: the API's fields, its serializer and its service (queues/forms.py)."""

    form = QueueCreateForm(request.POST if request.method == "POST" else None)
    if request.method == "POST":
        queue = form.save()
        if queue is not None:
            messages.success(request, f"Queue '{queue.name}' added.")
            return redirect("queues:detail", name=queue.name)
        form.focus_first_error()
    return render(
        request,
        "queues/queue_form.html",
        {"form": form, "queue": None},
        status=form.status,
    )


@require_http_methods(["GET", "POST"])
@console_view(operators_only=True)
def queue_edit(request, name: str):
    """The patch form: only the fields PATCH accepts, through the API's serializer and
    the same service; only what changed is sent."""

    try:
        queue = Queue.objects.select_related("provider").get(name=name)
    except Queue.DoesNotExist:
        raise Http404(f"Queue '{name}' does not exist.") from None
    form = QueueEditForm(request.POST if request.method == "POST" else None, queue=queue)
    if request.method == "POST":
        changed = form.payload() if form.is_valid() else {}
        saved = form.save()
        if saved is not None:
            if changed:
                fields = ", ".join(_api_names(changed))
                messages.success(request, f"Queue '{name}' saved ({fields}).")
            else:
                messages.info(request, f"Nothing to save: queue '{name}' is unchanged.")
            return redirect("queues:detail", name=name)
        form.focus_first_error()
    return render(
        request,
        "queues/queue_form.html",
        {"form": form, "queue": queue},
        status=form.status,
    )


def _api_names(changes: dict) -> list[str]:
    names = []
    for key, value in changes.items():
        if isinstance(value, dict):
            names += [f"{key}.{inner}" for inner in value]
        else:
            names.append(key)
    return names


# ---------------------------------------------------------------------------- error pages

PLAIN_500 = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Server error · '
    'Lakeshore Admin</title></head><body><h1>Server error</h1><p role="alert">The server '
    'failed; the error was logged.</p><p><a href="/">Back to the queues</a></p></body></html>'
)


@requires_csrf_token
def server_error(request, *args, **kwargs):
    """handler500: the console's 500 page, rendered without the request (its user, its
    session or the database may be what failed). Should even that fail, a plain page."""

    try:
        body = loader.render_to_string("500.html")
    except Exception:  # the page of last resort must not raise
        log.exception("the 500 page failed to render")
        body = PLAIN_500
    return HttpResponseServerError(body)


@requires_csrf_token
def permission_denied(request, exception=None, *args, **kwargs):
    """handler403: a PermissionDenied raised anywhere outside console_view (which names
    the role itself) shows the console's 403 page with its message."""
    message = str(exception or "") or "You may not do this."
    context = {"reason": message, "needed": None, "roles": sorted(roles_of(request.user))}
    return render(request, "console/forbidden.html", context, status=403)
