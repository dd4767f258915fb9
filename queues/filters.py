"""One FilterSet per list, shared by the API and the console pages."""

import django_filters

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
