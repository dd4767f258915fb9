"""Django admin: useful lists, and every write that has a rule goes through the service."""

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import QuerySet

from fleet.models import Daemon, Provider
from lakeshore_admin.errors import DomainError
from lakeshore_admin.parsers import DepthLimitedJSONFormField
from queues import services
from queues.models import Queue, QueueEvent


def _run(modeladmin, request, queryset, label: str, call) -> None:
    """Apply `call` to each object; report successes and each refusal's reason."""
    done = 0
    for obj in queryset:
        try:
            call(obj)
            done += 1
        except DomainError as exc:
            modeladmin.message_user(request, f"{obj}: {exc.message}", messages.ERROR)
    if done:
        modeladmin.message_user(request, f"{label}: {done} done.", messages.SUCCESS)


def _transition(action: str, description: str):
    @admin.action(description=description)
    def run(modeladmin, request, queryset):
        _run(
            modeladmin,
            request,
            queryset,
            action.title(),
            lambda q: services.queue_transition(name=q.name, action=action),
        )

    run.__name__ = f"queue_{action}"
    return run


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "kind",
        "state",
        "members",
        "provider",
        "elasticity_summary",
        "max_depth",
        "on_full",
        "description",
    ]
    list_filter = ["state", "kind", "elasticity_kind", "on_full", "provider"]
    search_fields = ["name", "description"]
    readonly_fields = [
        "state",
        "launch_failures",
        "launch_backoff_until",
        "created_at",
        "updated_at",
    ]
    list_select_related = ["provider"]
    actions = [
        _transition("drain", "Drain: stop admitting, finish what is admitted"),
        _transition("pause", "Pause: admit, dispatch nothing"),
        _transition("resume", "Resume (make active)"),
        _transition("archive", "Archive (soft-delete)"),
        _transition("unarchive", "Unarchive (make active)"),
    ]

    def get_queryset(self, request):
        return super().get_queryset(request).with_members()

    @admin.display(ordering="members", description="members")
    def members(self, queue):
        return queue.members

    @admin.display(description="elasticity")
    def elasticity_summary(self, queue):
        return queue.elasticity_text

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        if obj is not None:  # immutable after creation
            fields += ["name", "kind", "elasticity_kind"]
        return fields

    def save_model(self, request, obj, form, change):
        # The elasticity and temperature rules are the services' (one place).
        if change:
            changes = {f: form.cleaned_data[f] for f in form.changed_data if f in form.cleaned_data}
            numbers = {
                key.removeprefix("elasticity_"): changes.pop(key)
                for key in ("elasticity_min", "elasticity_max", "elasticity_threshold")
                if key in changes
            }
            if numbers:
                changes["elasticity"] = numbers
            if "provider" in changes:
                changes["provider"] = changes["provider"].name if changes["provider"] else ""
            services.queue_patch(name=obj.name, changes=changes)
        else:
            spec = None
            if obj.elasticity_kind:
                spec = {
                    "kind": obj.elasticity_kind,
                    "min": obj.elasticity_min,
                    "max": obj.elasticity_max,
                    "threshold": obj.elasticity_threshold,
                }
            created = services.queue_create(
                name=obj.name,
                kind=obj.kind,
                description=obj.description,
                provider=obj.provider.name if obj.provider else None,
                elasticity_spec=spec,
                instance_type=obj.instance_type,
                image_id=obj.image_id,
                runner=obj.runner,
                max_depth=obj.max_depth,
                on_full=obj.on_full,
                temperature=obj.temperature,
            )
            obj.pk = created.pk

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        admin_self = self

        class ServiceCheckedForm(form):
            """Runs the service in a dry run at validation, so refusals show on the form."""

            def _post_clean(self):
                super()._post_clean()
                if self.errors:
                    return
                try:
                    admin_self._dry_run(self)
                except DomainError as exc:
                    self.add_error(None, ValidationError(exc.message))

        return ServiceCheckedForm

    def _dry_run(self, form):
        obj = form.instance
        if obj.pk:
            changes = {}
            numbers = {}
            for key in form.changed_data:
                if key.startswith("elasticity_") and key != "elasticity_kind":
                    numbers[key.removeprefix("elasticity_")] = form.cleaned_data[key]
                elif key == "provider":
                    provider = form.cleaned_data[key]
                    changes[key] = provider.name if provider else ""
                elif key in form.cleaned_data:
                    changes[key] = form.cleaned_data[key]
            if numbers:
                changes["elasticity"] = numbers
            services.queue_patch(
                name=Queue.objects.get(pk=obj.pk).name, changes=changes, dry_run=True
            )
        elif obj.elasticity_kind:
            from queues import elasticity

            _, errors = elasticity.normalise(
                obj.elasticity_kind,
                {
                    "min": obj.elasticity_min,
                    "max": obj.elasticity_max,
                    "threshold": obj.elasticity_threshold,
                },
            )
            if errors:
                raise DomainError("; ".join(f"{k}: {v}" for k, v in errors.items()))

    def delete_model(self, request, obj):
        try:
            services.queue_delete(name=obj.name)
        except DomainError as exc:
            self.message_user(request, exc.message, messages.ERROR)

    def delete_queryset(self, request, queryset: QuerySet):
        _run(self, request, queryset, "Delete", lambda q: services.queue_delete(name=q.name))


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    # JSON typed into the form has the API's depth limit: too deep is a form error
    formfield_overrides = {models.JSONField: {"form_class": DepthLimitedJSONFormField}}
    list_display = ["name", "kind", "description", "created_at"]
    list_filter = ["kind"]
    search_fields = ["name", "description"]

    def get_readonly_fields(self, request, obj=None):
        return ["name", "kind"] if obj is not None else []

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
        _run(self, request, queryset, "Delete", lambda p: services.provider_delete(name=p.name))


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
        from queues.daemons import daemon_drop

        _run(self, request, queryset, "Drop", lambda d: daemon_drop(daemon=d))

    @admin.display(description="queues")
    def queue_list(self, daemon):
        return ", ".join(daemon.queues) or "(default)"


@admin.register(QueueEvent)
class QueueEventAdmin(admin.ModelAdmin):
    list_display = [
        "at",
        "queue",
        "action",
        "daemons",
        "busy",
        "pending",
        "desired",
        "delta",
        "reason",
    ]
    list_filter = ["action", "queue"]
    list_select_related = ["queue"]
    date_hierarchy = "at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
