"""Django admin: useful lists, and every write that has a rule goes through the service."""

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from lakeshore_admin.admin_actions import run_action
from lakeshore_admin.errors import DomainError
from queues import elasticity, services
from queues.models import Queue, QueueEvent


def _transition(action: str, description: str):
    @admin.action(description=description)
    def run(modeladmin, request, queryset):
        run_action(
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

            def clean(self):
                cleaned = super().clean()
                if not self.errors:
                    try:
                        admin_self._dry_run(self)
                    except DomainError as exc:
                        raise ValidationError(exc.message) from exc
                return cleaned

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
        elif kind := form.cleaned_data.get("elasticity_kind"):
            _, errors = elasticity.normalise(
                kind,
                {
                    key: form.cleaned_data.get(f"elasticity_{key}")
                    for key in ("min", "max", "threshold")
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
        run_action(self, request, queryset, "Delete", lambda q: services.queue_delete(name=q.name))


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
