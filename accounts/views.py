"""Console pages of accounts: the timeline (/events/: the controller's decisions and every
operator action, across queues, read by accounts/audit.py) and the API tokens (/tokens/,
with Revoke)."""

import re

from django import forms
from django.contrib import messages
from django.http import Http404
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.views.decorators.http import require_GET, require_POST

from accounts import audit, services
from accounts.console_access import console_view
from accounts.filters import EventFilter, TokenFilter
from accounts.models import AuditEvent
from accounts.roles import can_operate
from fleet.models import Daemon
from lakeshore_admin.lists import ConsoleListView
from lakeshore_admin.pages import after_action, back_url
from queues.models import Queue

DAEMON_TARGET = re.compile(r"^daemon (\d+)$")
MOMENT = {"type": "datetime-local"}


@method_decorator([require_GET, console_view], name="dispatch")
class EventListPage(ConsoleListView):
    """Newest first. Its rows come from two tables, merged by accounts/audit.py, so its
    key is a row's (at, kind, id) and its pages are read by audit.timeline_rows()."""

    template_name = "accounts/event_list.html"
    table_id = "event-table"
    filterset_class = EventFilter
    page_size = audit.TIMELINE_PAGE
    refresh = False
    labels = {"first": "Newest", "previous": "← Newer", "next": "Older →"}
    filter_look = {
        "queue": {"attrs": {"list": "queue-names", "size": 16}},
        "actor": {"attrs": {"size": 12, "placeholder": "user or controller"}},
        "since": {"widget": forms.DateTimeInput(attrs=MOMENT)},
        "until": {"widget": forms.DateTimeInput(attrs=MOMENT)},
    }

    def get_queryset(self):
        return AuditEvent.objects.none()  # the FilterSet only checks the values

    def source(self, filterset):
        return filterset.timeline_filters()

    def parse_key(self, raw):
        return raw if audit.decode_cursor(raw) else None

    def key_of(self, row):
        return audit.encode_cursor(row)

    def fetch(self, source, *, after=None, before=None, limit):
        return audit.timeline_rows(
            source, older_than=after or "", newer_than=before or "", limit=limit
        )

    def keys(self, source, *, limit):
        return [self.key_of(row) for row in audit.timeline_rows(source, limit=limit)]

    def decorate(self, rows):
        """The names of the daemons the page's actions name ("daemon 7"), one query, so
        that the name links to the daemon's page as its target does."""
        ids = {
            int(row["target"].split()[1])
            for row in rows
            if DAEMON_TARGET.match(row.get("target") or "")
        }
        names = dict(Daemon.objects.filter(pk__in=ids).values_list("pk", "name")) if ids else {}
        for row in rows:
            found = DAEMON_TARGET.match(row.get("target") or "")
            if found:
                row["daemon_name"] = names.get(int(found.group(1)))

    def datalists(self):
        names = Queue.objects.order_by("name").values_list("name", flat=True)
        return {"queue-names": list(names[:500])}


@method_decorator([require_GET, console_view], name="dispatch")
class TokenListPage(ConsoleListView):
    """API tokens, newest first: what each may do and whether it still works. Never a
    secret: tokens are stored hashed, and the page shows a token's first characters."""

    template_name = "accounts/token_list.html"
    table_id = "token-table"
    filterset_class = TokenFilter
    refresh = False
    labels = {"first": "Newest", "previous": "← Newer", "next": "Older →"}
    filter_look = {"user": {"attrs": {"size": 14}}}

    def get_queryset(self):
        return services.tokens_visible_to(self.request.user)

    def extra_context_data(self):
        user = self.request.user
        return {"can_act": can_operate(user), "sees_all": services.is_token_admin(user)}


@require_POST
@console_view
def token_revoke(request, token_id: int):
    """Revoke a token from the console: the API's service and rules, for the operator
    role, and only a token this user's tokens page shows."""
    token = services.tokens_visible_to(request.user).filter(pk=token_id).first()
    if token is None:
        raise Http404(f"Token {token_id} does not exist.")
    if services.token_revoke(actor=request.user, token=token):
        messages.success(request, f"Token {token.prefix}… ({token.name}) revoked.")
    else:
        messages.info(request, f"Token {token.prefix}… ({token.name}) was already revoked.")
    page = reverse("accounts:tokens")
    return after_action(request, back_url(request, page) if request.htmx else page)
