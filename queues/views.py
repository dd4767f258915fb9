"""Console pages (HTML). The lists use the same FilterSet and QuerySet as the API."""

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST
from rest_framework.permissions import SAFE_METHODS

from accounts.models import Role
from accounts.permissions import ReadOrOperate
from accounts.roles import can_operate, roles_of
from queues.filters import QueueFilter
from queues.models import Queue, QueueState

PAGE_SIZE = 100


def console_view(view):
    """Every console page and action: a login, then the API's own rule (ReadOrOperate):
    reading needs the viewer or operator role, acting (POST) the operator role; staff
    act as operators. Without it, a 403 page names the role and who grants it."""

    @wraps(view)
    @login_required
    def checked(request, *args, **kwargs):
        rule = ReadOrOperate()
        if rule.has_permission(request, view):
            return view(request, *args, **kwargs)
        needed = (Role.VIEWER if request.method in SAFE_METHODS else Role.OPERATOR).value
        context = {
            "reason": rule.message,
            "needed": needed,
            "roles": sorted(roles_of(request.user)),
        }
        return render(request, "console/forbidden.html", context, status=403)

    return checked


def page_offset(request) -> int:
    """A page link's offset: a missing, garbled or out-of-range one is the first page."""
    from lakeshore_admin.pagination import MAX_OFFSET

    try:
        offset = int(request.GET.get("offset", 0))
    except ValueError:
        return 0
    return offset if 0 <= offset <= MAX_OFFSET else 0


@require_GET
@console_view
def queue_list(request):
    filterset = QueueFilter(request.GET, queryset=Queue.objects.for_list())
    queues = filterset.qs if filterset.is_valid() else Queue.objects.none()
    offset = page_offset(request)
    rows = list(queues[offset : offset + PAGE_SIZE + 1])
    template = "queues/queue_list.html"
    if request.htmx:
        template += "#queue-table"
    return render(
        request,
        template,
        {
            "queues": rows[:PAGE_SIZE],
            "next_offset": offset + PAGE_SIZE if len(rows) > PAGE_SIZE else None,
            "page_size": PAGE_SIZE,
            "state": filterset.form.cleaned_data.get("state") if filterset.is_valid() else "",
            "states": QueueState.choices,
        },
    )


MEMBERS_SHOWN = 200
EVENTS_SHOWN = 20
ACTIONS = ["drain", "pause", "resume", "archive", "unarchive"]


def _detail_context(request, name: str, *, error: str = "") -> dict:
    from django.http import Http404

    from queues import services
    from queues.models import Daemon, QueueEvent

    try:
        queue = Queue.objects.for_list().get(name=name)
    except Queue.DoesNotExist:
        raise Http404(f"Queue '{name}' does not exist.") from None
    return {
        "queue": queue,
        "stats": services.queue_stats(queue),
        "members": list(
            Daemon.objects.live().subscribed_to(name).for_list().order_by("id")[:MEMBERS_SHOWN]
        ),
        "members_shown": MEMBERS_SHOWN,
        "events": list(QueueEvent.objects.filter(queue=queue).decisions()[:EVENTS_SHOWN]),
        "can_act": can_operate(request.user),
        "actions": ACTIONS,
        "error": error,
    }


@require_GET
@console_view
def queue_detail(request, name: str):
    template = "queues/queue_detail.html"
    if request.htmx and request.htmx.target == "queue-summary":
        template += "#queue-summary"
    return render(request, template, _detail_context(request, name))


@require_POST
@console_view
def queue_action(request, name: str, action: str):
    """drain, pause, resume, archive, unarchive from the console: the same service as
    the API; a refusal shows in the page instead of an error status."""
    from lakeshore_admin.errors import DomainError
    from queues import services

    if action not in ACTIONS:
        from django.http import Http404

        raise Http404(f"No action '{action}'.")
    error = ""
    try:
        services.queue_transition(name=name, action=action)
    except DomainError as exc:
        error = exc.message
    if not request.htmx:
        from django.shortcuts import redirect

        return redirect("console-queue", name=name)
    return render(
        request,
        "queues/queue_detail.html#queue-summary",
        _detail_context(request, name, error=error),
    )


DAEMON_PAGE = 100


@require_GET
@console_view
def daemon_list(request):
    from queues.filters import DaemonFilter
    from queues.models import LIVE_DAEMON_STATES, Daemon, DaemonState

    params = request.GET.copy()
    if "state" not in params:  # live ones unless asked otherwise
        params.setlist("state", [str(s) for s in LIVE_DAEMON_STATES])
    filterset = DaemonFilter(params, queryset=Daemon.objects.for_list().order_by("-id"))
    valid = filterset.is_valid()
    offset = page_offset(request)
    rows = list(filterset.qs[offset : offset + DAEMON_PAGE + 1]) if valid else []
    template = "queues/daemon_list.html"
    if request.htmx and request.htmx.target == "daemon-table":
        template += "#daemon-table"
    return render(
        request,
        template,
        {
            "daemons": rows[:DAEMON_PAGE],
            "next_offset": offset + DAEMON_PAGE if len(rows) > DAEMON_PAGE else None,
            "errors": None if valid else filterset.errors,
            "states": DaemonState.choices,
            "chosen": params.getlist("state"),
            "queue": request.GET.get("queue", ""),
            "can_act": can_operate(request.user),
        },
    )


@require_POST
@console_view
def daemon_drop(request, daemon_id: int):
    """Drop a daemon from the console: the same service as the API and the CLI."""
    from django.shortcuts import redirect

    from queues import services
    from queues.daemons import daemon_drop as drop

    try:
        daemon = services.daemon_get(daemon_id)
    except services.NotFound as exc:
        from django.http import Http404

        raise Http404(exc.message) from None
    drop(daemon=daemon)
    return redirect("console-daemons")
