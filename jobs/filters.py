"""One FilterSet for the invocation list (API and console)."""

import django_filters
from django import forms

from jobs.models import Invocation, InvocationState


class IdFilter(django_filters.NumberFilter):
    """A whole-number id within PostgreSQL's bigint: '1.5' or 10**30 are refused."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", 2**63 - 1)
        super().__init__(*args, **kwargs)


class InvocationFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=InvocationState.choices)
    worker = IdFilter(field_name="daemon_id", label="daemon id")
    queue = django_filters.CharFilter(field_name="queue", label="queue name ('' = default)")
    cursor = IdFilter(
        field_name="id", lookup_expr="lt", label="only invocations older than this id"
    )

    class Meta:
        model = Invocation
        fields = ["state", "worker", "queue", "cursor"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.form.fields["worker"].widget = forms.TextInput()
