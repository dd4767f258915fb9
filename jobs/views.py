"""Console pages for jobs: the same FilterSet and keyset order as the API's list."""

import json

from django import forms
from django.contrib import messages
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from accounts import heavy
from accounts.console_access import console_view
from accounts.models import AuditEvent
from accounts.roles import can_operate
from jobs import sdk, search, services, serving
from jobs.filters import InvocationFilter
from jobs.log_views import log_context
from jobs.models import RETRYABLE_STATES, Invocation, InvocationState
from lakeshore_admin.errors import DomainError
from lakeshore_admin.lists import ConsoleListView
from lakeshore_admin.pages import after_action, back_url
from queues.models import Queue

PAGE_SIZE = 50
NUMERIC = {"inputmode": "numeric"}
MOMENT = {"type": "datetime-local"}
TIMELINE_ACTIONS = 50  # operator actions shown on a job's page
CANCEL_COUNT_CAP = 10_000  # the bulk buttons count up to this, then say "10,000+"
RETRY_FILTERS = {"state", "queue", "search"}  # the list's filters a bulk retry takes


@method_decorator([require_GET, console_view], name="dispatch")
class JobListPage(ConsoleListView):
    """Newest first, with the API's FilterSet; an operator filtering by queue gets a
    button that cancels what is queued there."""

    template_name = "jobs/invocation_list.html"
    table_id = "job-table"
    filterset_class = InvocationFilter
    page_size = PAGE_SIZE
    above_table = True
    shown_filters = ("state", "queue", "search", "function", "id", "worker", "since", "until")
    labels = {"first": "Newest jobs", "previous": "← Newer jobs", "next": "Older jobs →"}
    filter_look = {
        "state": {"widget": forms.CheckboxSelectMultiple()},
        "queue": {"label": "Queue", "attrs": {"list": "queue-names", "size": 14}},
        "search": {
            "label": "Search",
            "attrs": {"size": 18, "placeholder": "function, key or error", "type": "search"},
        },
        "function": {"label": "Function", "attrs": {"size": 18, "placeholder": "a prefix"}},
        "id": {"label": "ID", "widget": forms.TextInput(), "attrs": NUMERIC | {"size": 7}},
        "worker": {"label": "Daemon", "attrs": NUMERIC | {"size": 5}},
        "since": {"label": "From", "widget": forms.DateTimeInput(attrs=MOMENT)},
        "until": {"label": "To", "widget": forms.DateTimeInput(attrs=MOMENT)},
    }

    _search_ids: list[int] | None = None  # this request's (a view serves one request)

    def get_queryset(self):
        return Invocation.objects.light()

    def searched(self) -> str:
        return self.filterset.form.cleaned_data.get("search") or ""

    def fetch(self, source, *, after=None, before=None, limit: int) -> list:
        """A search's pages newest first read as jobs/search.py reads them; its first
        page from the ids the pager reads anyway (one search a refresh, not two)."""
        text = self.searched()
        if text and after is None and before is None:
            ids = self.search_ids(source)[:limit]
            return list(source.filter(id__in=ids).order_by("-id")) if ids else []
        with search.bounded(text):
            if text and before is None:
                return search.newest(source, limit, below=after)
            return super().fetch(source, after=after, before=before, limit=limit)

    def keys(self, source, *, limit: int) -> list[str]:
        if not self.searched():
            return super().keys(source, limit=limit)
        return [str(pk) for pk in self.search_ids(source)[:limit]]

    def search_ids(self, source) -> list[int]:
        """The ids of a search's first pages, as many as the pager numbers, newest first:
        read once a request."""
        if self._search_ids is None:
            with search.bounded(self.searched()):
                self._search_ids = search.newest(
                    source.values_list("id", flat=True), self.page_size * self.max_pages + 1
                )
        return self._search_ids

    def datalists(self):
        return {"queue-names": queue_names()}

    def extra_context_data(self):
        request = self.request
        queue = request.GET.get("queue")
        can_act = can_operate(request.user)
        cancel_count = None
        if self.valid and can_act and queue is not None:
            try:
                counted = services.invocation_bulk_cancel(
                    queue=queue, dry_run=True, cap=CANCEL_COUNT_CAP
                )  # on every refresh: bounded
            except services.NotFound:
                counted = 0
            if counted:
                capped = counted > CANCEL_COUNT_CAP
                cancel_count = f"{CANCEL_COUNT_CAP:,}+" if capped else f"{counted:,}"
        return {
            "can_act": can_act,
            "cancel_count": cancel_count,
            "cancel_queue": queue,
            "retry": self.retry_offer() if self.valid and can_act else None,
        }

    def retry_offer(self) -> dict | None:
        """The bulk retry of what the list shows, when its filters are ones a bulk retry
        takes (ended states it retries, a queue, a search): the same selection, counted
        (bounded) on every refresh."""
        given = {name for name, value in self.request.GET.lists() if any(value)} - {"cursor"}
        states = self.request.GET.getlist("state")
        if not states or not set(states) <= set(RETRYABLE_STATES) or given - RETRY_FILTERS:
            return None
        selection = {
            "states": states,
            "queue": self.request.GET.get("queue"),
            "search": self.request.GET.get("search", ""),
        }
        try:
            counted = services.invocation_bulk_retry(
                **selection, dry_run=True, cap=CANCEL_COUNT_CAP
            )
        except DomainError:
            return None
        if not counted["matched"]:
            return None
        capped = counted["matched"] > CANCEL_COUNT_CAP
        return {
            **selection,
            "count": f"{CANCEL_COUNT_CAP:,}+" if capped else f"{counted['matched']:,}",
            "filter": counted["filter"],
        }


def queue_names() -> list[str]:
    """The queues a queue filter suggests (the first 500 by name)."""
    return list(Queue.objects.order_by("name").values_list("name", flat=True)[:500])


@require_POST
@console_view
def job_bulk_cancel(request):
    """Cancel what is queued in one queue, from the jobs list's queue filter: the same
    service as the API and the CLI."""

    queue = request.POST.get("queue")
    back = back_url(request, f"{reverse('jobs:list')}?{urlencode({'queue': queue or ''})}")
    if queue is None:
        messages.error(request, "Nothing was cancelled: choose a queue first.")
        return after_action(request, back)
    try:
        with heavy.requests.one_of(request.user):
            count = services.invocation_bulk_cancel(
                queue=queue, reason="bulk-cancel from the console"
            )
    except DomainError as exc:
        messages.error(request, f"Nothing was cancelled: {exc.message}")
    else:
        messages.success(
            request, f"Cancelled {count} queued invocation(s) of queue {queue or '(default)'}."
        )
    return after_action(request, back)


@require_POST
@console_view
def job_bulk_retry(request):
    """Retry what the jobs list shows (its states, queue and search), from its button:
    the same service as the API and the CLI."""
    states = request.POST.getlist("state")
    queue = request.POST.get("queue")
    search = request.POST.get("search", "")
    query = [("state", s) for s in states] + [("queue", queue or "")] * (queue is not None)
    query += [("search", search)] * bool(search)
    back = back_url(request, f"{reverse('jobs:list')}?{urlencode(query)}")
    try:
        with heavy.requests.one_of(request.user):
            done = services.invocation_bulk_retry(states=states, queue=queue, search=search)
    except DomainError as exc:
        messages.error(request, f"Not every job was retried: {exc.message}")
    else:
        messages.success(request, f"Retried {done['retried']:,} job(s): {done['filter']}.")
    return after_action(request, back)


def _job_or_404(invocation_id) -> Invocation:

    try:
        return services.invocation_get(invocation_id)
    except services.NotFound as exc:
        raise Http404(exc.message) from None


def _pretty(value) -> str:

    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def _timeline(job: Invocation, retried_as: int | None) -> list[dict]:
    """What happened to the job, from its own record (oldest first)."""
    steps = [{"at": job.created_at, "text": f"queued in {job.queue or '(default)'}"}]
    if job.retry_of_id:
        steps[0]["text"] += f", retrying job {job.retry_of_id}"
    if job.started_at:
        where = f" on daemon {job.daemon_id}" if job.daemon_id else ""
        steps.append(
            {
                "at": job.started_at,
                "text": f"attempt {job.attempts} of {job.max_attempts} started{where}",
            }
        )
    if job.finished_at:
        why = f": {job.reason}" if job.reason else ""
        steps.append({"at": job.finished_at, "text": f"ended {job.state}{why}"})
    if job.finished_before_kill:
        steps.append(
            {
                "at": job.discarded_at,
                "text": f"daemon {job.daemon_id} reported attempt {job.attempts} "
                f"{job.discarded_outcome}: the job had finished its work before the kill "
                "reached it; that outcome was discarded",
            }
        )
    if job.scheduled_at and job.state == InvocationState.QUEUED:
        steps.append({"at": job.scheduled_at, "text": "next attempt may start (retry back-off)"})

    for row in AuditEvent.objects.filter(target=f"job {job.pk}").order_by("at")[:TIMELINE_ACTIONS]:
        steps.append({"at": row.at, "text": f"{row.actor} (via {row.via}): {row.summary}"})
    steps.sort(key=lambda step: step["at"])
    if retried_as and not any("retried" in step["text"] for step in steps):
        steps.append({"at": None, "text": f"retried as job {retried_as}"})
    return steps


@require_GET
@console_view
def job_detail(request, invocation_id: int):

    job = _job_or_404(invocation_id)
    position = services.queue_position(job)
    retried_as = services.retried_as(job)
    ran = waited = None
    if job.started_at:
        waited = (job.started_at - job.created_at).total_seconds()
        if job.finished_at:
            ran = (job.finished_at - job.started_at).total_seconds()
    context = {
        "job": job,
        "position": position,
        "eta": services.queue_eta(job, position),
        # who will run it: said when nothing serves its queue (jobs/serving.py)
        "serving": serving.of_queue(job.queue) if position is not None else None,
        "start_command": serving.start_command(job.queue),
        "retried_as": retried_as,
        "can_act": can_operate(request.user),
        "waited": waited,
        "ran": ran,
        "args_text": _pretty(job.args),
        "kwargs_text": _pretty(job.kwargs),
        "result_text": _pretty(job.result),
        "sdk_note": sdk.function_note(job) if job.wire else "",
        "args_bytes": job.blob_size("args_blob"),
        "result_bytes": job.blob_size("result_blob"),
        "timeline": _timeline(job, retried_as),
    }
    template = "jobs/invocation_detail.html"
    if request.htmx and request.htmx.target == "job-summary":
        template += "#job-summary"  # its refresh: the log refreshes itself
    else:
        context |= log_context(job, request.GET.get("attempt"))
    return render(request, template, context)


@require_POST
@console_view
def job_kill(request, invocation_id: int):
    """Kill a queued job from the console: the same service as the API and the CLI."""

    job = _job_or_404(invocation_id)
    try:
        services.invocation_kill(invocation_id=job.pk, reason="killed from the console")
        messages.success(request, f"Job {job.pk} killed.")
    except DomainError as exc:
        messages.error(request, f"Job {job.pk} was not killed: {exc.message}")
    return after_action(request, reverse("jobs:detail", args=[job.pk]))


@require_POST
@console_view
def job_retry(request, invocation_id: int):
    """Retry an ended job from the console (a new job linked to it): the same service as
    the API and the CLI. Success goes to the new job's page."""

    job = _job_or_404(invocation_id)
    try:
        new = services.invocation_retry(invocation_id=job.pk)
    except DomainError as exc:
        messages.error(request, f"Job {job.pk} was not retried: {exc.message}")
        return after_action(request, reverse("jobs:detail", args=[job.pk]))
    messages.success(request, f"Job {job.pk} retried as job {new.pk}.")
    return after_action(request, reverse("jobs:detail", args=[new.pk]))
