"""One FilterSet for the invocation list (API and console)."""

import django_filters
from django import forms

from jobs.models import SEARCH_MAX_LENGTH, SEARCH_MIN_LENGTH, Invocation, InvocationState
from lakeshore_admin.names import DEFAULT_QUEUE_LABEL


class IdFilter(django_filters.NumberFilter):
    """A whole-number id within PostgreSQL's bigint: '1.5' or 10**30 are refused."""

    field_class = forms.IntegerField

    def holding(self, queryset, name, value):
        return queryset.matching(value)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", 2**63 - 1)
        super().__init__(*args, **kwargs)


class InvocationFilter(django_filters.FilterSet):
    # one table, one row an invocation: no DISTINCT (django-filter adds one by default)
    state = django_filters.MultipleChoiceFilter(choices=InvocationState.choices, distinct=False)
    daemon = IdFilter(field_name="daemon_id", label="daemon id")
    # the cookbook's name for the same filter (`lakeshore jobs list --worker ID`)
    worker = IdFilter(field_name="daemon_id", label="daemon id (the same as daemon)")
    queue = django_filters.CharFilter(
        method="in_queue", label="queue name ('(default)': the default queue)"
    )
    cursor = IdFilter(
        field_name="id", lookup_expr="lt", label="only invocations older than this id"
    )
    id = IdFilter(field_name="id", label="invocation id")
    function = django_filters.CharFilter(
        field_name="function", lookup_expr="startswith", label="function (a prefix)"
    )
    search = django_filters.CharFilter(
        method="holding",
        min_length=SEARCH_MIN_LENGTH,
        max_length=SEARCH_MAX_LENGTH,
        label="text in the function, the key or the error's headline (any case)",
    )
    since = django_filters.IsoDateTimeFilter(
        field_name="created_at", lookup_expr="gte", label="submitted at or after (ISO 8601)"
    )
    until = django_filters.IsoDateTimeFilter(
        field_name="created_at", lookup_expr="lt", label="submitted before (ISO 8601)"
    )

    class Meta:
        model = Invocation
        fields = [
            "state",
            "daemon",
            "worker",
            "queue",
            "cursor",
            "id",
            "function",
            "search",
            "since",
            "until",
        ]

    def in_queue(self, queryset, name, value):
        return queryset.filter(queue="" if value == DEFAULT_QUEUE_LABEL else value)

    def holding(self, queryset, name, value):
        return queryset.matching(value)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.form.fields["worker"].widget = forms.TextInput()
