"""Console pages of accounts: the timeline (/events/: the controller's decisions and every
operator action, across queues, read by accounts/audit.py) and the API tokens (/tokens/)."""

from django import forms
from django.utils.decorators import method_decorator
from django.views.decorators.http import require_GET

from accounts import audit
from accounts.console import console_view
from accounts.filters import EventFilter
from accounts.models import AuditEvent
from lakeshore_admin.lists import ConsoleListView
from queues.models import Queue

MOMENT = {"type": "datetime-local"}


@method_decorator([require_GET, console_view], name="dispatch")
class EventList(ConsoleListView):
    """Newest first. Its rows come from two tables, merged by accounts/audit.py, so its
    key is a row's (at, kind, id) and its pages are read by audit.timeline_rows()."""

    template_name = "events/event_list.html"
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

    def datalists(self):
        names = Queue.objects.order_by("name").values_list("name", flat=True)
        return {"queue-names": list(names[:500])}
