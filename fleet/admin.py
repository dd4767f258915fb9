"""Django admin for providers and daemons: useful lists, and every write that has a rule
goes through the service."""

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db import models

from fleet import daemons, services
from fleet.models import Daemon, Provider
from lakeshore_admin.admin_actions import run_action
from lakeshore_admin.errors import DomainError
from lakeshore_admin.parsers import DepthLimitedJSONFormField


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    # JSON typed into the form has the API's depth limit: too deep is a form error
    formfield_overrides = {models.JSONField: {"form_class": DepthLimitedJSONFormField}}
    list_display = ["name", "kind", "description", "created_at"]
    list_filter = ["kind"]
    search_fields = ["name", "description"]

    def get_readonly_fields(self, request, obj=None):
        observed = ["observed", "observed_at"]  # the controller's tick writes them
        return ["name", "kind", *observed] if obj is not None else observed

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)

        class CheckedForm(form):
            def clean_config(self):
                kind = self.instance.kind if self.instance.pk else self.cleaned_data.get("kind")
                try:  # the credential and per-kind rules are the service's
                    return services.check_provider_config(self.cleaned_data.get("config"), kind)
                except DomainError as exc:
                    raise ValidationError(exc.message) from exc

        return CheckedForm

    def save_model(self, request, obj, form, change):
        if change:
            services.provider_patch(
                name=obj.name, changes={"description": obj.description, "config": obj.config}
            )
        else:
            created = services.provider_create(
                name=obj.name, kind=obj.kind, description=obj.description, config=obj.config
            )
            obj.pk = created.pk

    def delete_model(self, request, obj):
        try:
            services.provider_delete(name=obj.name)
        except DomainError as exc:
            self.message_user(request, exc.message, messages.ERROR)

    def delete_queryset(self, request, queryset):
        run_action(
            self, request, queryset, "Delete", lambda p: services.provider_delete(name=p.name)
        )


@admin.register(Daemon)
class DaemonAdmin(admin.ModelAdmin):
    """Daemons register themselves: admin shows them and can drop them."""

    list_display = [
        "id",
        "name",
        "state",
        "queue_list",
        "provider",
        "instance_type",
        "last_heartbeat_at",
    ]
    list_filter = ["state", "provider"]
    search_fields = ["name", "external_id"]
    list_select_related = ["provider"]
    actions = ["drop"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # "drop" keeps the row and ends its work as the protocol says

    @admin.action(description="Drop the selected daemons (their running work ends killed)")
    def drop(self, request, queryset):
        run_action(self, request, queryset, "Drop", lambda d: daemons.daemon_drop(daemon=d))

    @admin.display(description="queues")
    def queue_list(self, daemon):
        return ", ".join(daemon.queues) or "(default)"
