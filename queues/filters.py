"""One FilterSet per list, shared by the API and the console pages."""

import django_filters

from fleet.models import Daemon, DaemonState
from jobs.filters import IdFilter
from queues.models import Queue, QueueState


class QueueFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=QueueState.choices)

    class Meta:
        model = Queue
        fields = ["state"]

    @property
    def qs(self):
        # Archived queues are hidden unless asked for by state.
        queryset = super().qs
        if not self.form.cleaned_data.get("state"):
            queryset = queryset.exclude(state=QueueState.ARCHIVED)
        return queryset


class DaemonFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=DaemonState.choices)
    queue = django_filters.CharFilter(method="filter_queue", label="subscribed to queue")
    id = IdFilter(field_name="id", label="daemon id")

    class Meta:
        model = Daemon
        fields = ["state", "queue", "id"]

    def filter_queue(self, queryset, name, value):
        return queryset.subscribed_to(value)
