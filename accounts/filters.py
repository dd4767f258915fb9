"""FilterSets of the console's lists that live in accounts: the timeline and the tokens."""

import django_filters
from django import forms

from accounts import audit
from accounts.models import ApiToken, AuditEvent, Role


class EventFilter(django_filters.FilterSet):
    """The timeline's filters. The timeline reads two tables (accounts/audit.py), so
    this FilterSet checks the values and timeline_rows() applies them."""

    queue = django_filters.CharFilter(label="Queue")
    action = django_filters.ChoiceFilter(
        choices=[(name, name) for name in audit.known_actions()], empty_label="any"
    )
    actor = django_filters.CharFilter(label="Who")
    since = django_filters.IsoDateTimeFilter(label="From")
    until = django_filters.IsoDateTimeFilter(label="To")
    noop = django_filters.BooleanFilter(label="show tick_noop", widget=forms.CheckboxInput)

    class Meta:
        model = AuditEvent
        fields: list[str] = []

    def timeline_filters(self) -> dict:
        """The checked values as accounts.audit.timeline_rows() takes them."""
        data = self.form.cleaned_data
        filters = {name: data.get(name) or None for name in ("queue", "action", "actor")}
        filters |= {"since": data.get("since"), "until": data.get("until")}
        return filters | {"noop": bool(data.get("noop"))}


class TokenFilter(django_filters.FilterSet):
    """The tokens page's filters."""

    user = django_filters.CharFilter(field_name="user__username", label="User")
    role = django_filters.ChoiceFilter(choices=Role.choices, label="Role", empty_label="any")
    usable = django_filters.BooleanFilter(
        method="filter_usable", label="usable only", widget=forms.CheckboxInput
    )

    class Meta:
        model = ApiToken
        fields = ["user", "role", "usable"]

    def filter_usable(self, queryset, name, value):
        return queryset.usable() if value else queryset
