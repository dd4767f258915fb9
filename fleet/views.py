"""Console pages for daemons: the list (state, queues, every job each runs now, the last
heartbeat), Drop, and stopping a job on its daemon. The list uses the API's FilterSet."""

from django import forms
from django.contrib import messages
from django.http import Http404
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.views.decorators.http import require_GET, require_POST

from accounts.console_access import console_view
from accounts.roles import can_operate
from fleet import daemons, orders, services
from fleet.filters import DaemonFilter
from fleet.models import LIVE_DAEMON_STATES, Daemon
from jobs import services as job_services
from jobs.models import Invocation, InvocationState
from lakeshore_admin.errors import DomainError, NotFound
from lakeshore_admin.lists import ConsoleListView
from lakeshore_admin.pages import after_action, back_url

DAEMON_PAGE = 100


@method_decorator([require_GET, console_view], name="dispatch")
class DaemonListPage(ConsoleListView):
    """Newest first; the live ones unless the address asks for states or an id."""

    template_name = "fleet/daemon_list.html"
    table_id = "daemon-table"
    filterset_class = DaemonFilter
    page_size = DAEMON_PAGE
    shown_filters = ("state", "queue")
    labels = {"first": "Newest", "previous": "← Newer", "next": "Older →"}
    filter_look = {
        "state": {"widget": forms.CheckboxSelectMultiple()},
        "queue": {"label": "Queue", "attrs": {"size": 16}},
    }

    def get_queryset(self):
        return Daemon.objects.for_list()

    def filter_data(self):
        params = self.request.GET.copy()
        if "state" not in params and "id" not in params:
            params.setlist("state", [str(s) for s in LIVE_DAEMON_STATES])
        return params

    def decorate(self, rows):
        """Every job each daemon runs now (a daemon runs several): one query a page."""
        running: dict[int, list[dict]] = {}
        for job in (
            Invocation.objects.filter(
                state=InvocationState.RUNNING, daemon_id__in=[d.pk for d in rows]
            )
            .order_by("id")
            .values("id", "function", "daemon_id", "started_at")
        ):
            running.setdefault(job["daemon_id"], []).append(job)
        for daemon in rows:
            daemon.jobs_now = running.get(daemon.pk, [])

    def extra_context_data(self):
        return {"can_act": can_operate(self.request.user)}


@require_POST
@console_view
def daemon_drop(request, daemon_id: int):
    """Drop a daemon from the console: the same service as the API and the CLI; the
    outcome is said in the page's live region."""
    try:
        daemon = services.daemon_get(daemon_id)
    except NotFound as exc:
        raise Http404(exc.message) from None
    try:
        ended = daemons.daemon_drop(daemon=daemon)
    except DomainError as exc:
        messages.error(request, f"Daemon {daemon.pk} was not dropped: {exc.message}")
    else:
        if not ended["terminated"]:
            messages.info(request, f"Daemon {daemon.pk} ({daemon.name}) had already ended.")
        else:
            killed = ended["ended"]
            what = f"; {killed} running job(s) ended killed" if killed else ""
            messages.success(request, f"Daemon {daemon.pk} ({daemon.name}) dropped{what}.")
    daemons_page = reverse("fleet:daemons")
    return after_action(request, back_url(request, daemons_page) if request.htmx else daemons_page)


@require_POST
@console_view
def job_stop(request, daemon_id: int, invocation_id: int):
    """Stop a running job on its daemon from the console (the job page's "Stop on daemon"):
    the same order through the same service as the API's daemon exec and `lakeshore daemon
    exec DAEMON kill JOB`. The daemon is the one the page named: should the job run on
    another by now, the service refuses and says which."""
    try:
        daemon = services.daemon_get(daemon_id)
        job = job_services.invocation_get(invocation_id)
    except NotFound as exc:
        raise Http404(exc.message) from None
    try:
        orders.daemon_exec(daemon=daemon, verb="kill", invocation_id=job.pk)
        messages.success(
            request,
            f"Job {job.pk} killed; daemon {daemon.pk} stops its processes at its next heartbeat.",
        )
    except DomainError as exc:
        messages.error(request, f"Job {job.pk} was not stopped: {exc.message}")
    return after_action(request, reverse("jobs:detail", args=[job.pk]))
