"""The daemons' FilterSet, shared by the API and the console page."""

import django_filters

from fleet.models import Daemon, DaemonState
from jobs.filters import IdFilter


class DaemonFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=DaemonState.choices)
    queue = django_filters.CharFilter(method="filter_queue", label="subscribed to queue")
    id = IdFilter(field_name="id", label="daemon id")

    class Meta:
        model = Daemon
        fields = ["state", "queue", "id"]

    def filter_queue(self, queryset, name, value):
        return queryset.subscribed_to(value)
