"""Console page of the timeline (/events/): the controller's decisions and every operator
action, across queues (accounts/audit.py reads them)."""

from django.shortcuts import render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from accounts import audit
from accounts.console import console_view
from queues.models import Queue

FILTERS = ("queue", "action", "actor", "since", "until", "noop")


def _moment(value: str, name: str, errors: dict):
    """A datetime-local value (UTC), or None; a bad one is an error for its field."""

    if not value:
        return None
    try:
        parsed = parse_datetime(value)
    except ValueError:
        parsed = None
    if parsed is None:
        errors[name] = f"{value!r} is not a date and time (YYYY-MM-DDTHH:MM, UTC)."
        return None
    if timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed, timezone.UTC)
    return parsed


@require_GET
@console_view
def event_list(request):

    get = request.GET
    errors: dict[str, str] = {}
    actions = audit.known_actions()
    action = get.get("action", "")
    if action and action not in actions:
        errors["action"] = f"Unknown action {action!r}."
    since = _moment(get.get("since", ""), "since", errors)
    until = _moment(get.get("until", ""), "until", errors)
    rows, cursor = [], None
    if not errors:
        rows, cursor = audit.timeline(
            queue=get.get("queue") or None,
            action=action or None,
            actor=get.get("actor") or None,
            since=since,
            until=until,
            noop=get.get("noop") == "1",
            cursor=get.get("cursor", ""),
        )
    next_url = None
    if cursor:
        params = get.copy()
        params["cursor"] = cursor
        next_url = f"?{urlencode(params, doseq=True)}"
    newest_url = None
    if get.get("cursor"):
        params = get.copy()
        params.pop("cursor")
        newest_url = f"?{urlencode(params, doseq=True)}"
    template = "events/event_list.html"
    if request.htmx and request.htmx.target == "event-table":
        template += "#event-table"
    return render(
        request,
        template,
        {
            "rows": rows,
            "errors": errors,
            "next_url": next_url,
            "newest_url": newest_url,
            "actions": actions,
            "queues": list(Queue.objects.order_by("name").values_list("name", flat=True)[:500]),
            "chosen": {
                key: get.get(key, "")
                for key in ("queue", "action", "actor", "since", "until", "noop")
            },
        },
    )
