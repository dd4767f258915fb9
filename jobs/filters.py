"""One FilterSet for the invocation list (API and console)."""

import django_filters
from django import forms

from jobs.models import Invocation, InvocationState


class InvocationFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=InvocationState.choices)
    worker = django_filters.NumberFilter(field_name="daemon_id", label="daemon id")
    queue = django_filters.CharFilter(field_name="queue", label="queue name ('' = default)")
    cursor = django_filters.NumberFilter(
        field_name="id", lookup_expr="lt", label="only invocations older than this id"
    )

    class Meta:
        model = Invocation
        fields = ["state", "worker", "queue", "cursor"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.form.fields["worker"].widget = forms.TextInput()
