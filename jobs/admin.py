from django.contrib import admin

from jobs import services
from jobs.models import Invocation
from lakeshore_admin.admin_actions import run_action


@admin.register(Invocation)
class InvocationAdmin(admin.ModelAdmin):
    """Read-only: invocations change state through the API, the daemons and these actions."""

    list_display = [
        "id",
        "function",
        "queue",
        "state",
        "priority_shown",
        "daemon",
        "attempts",
        "created_at",
    ]
    list_filter = ["state", "queue"]
    search_fields = ["function", "key"]
    list_select_related = ["daemon"]
    show_full_result_count = False  # no COUNT(*) over every invocation
    actions = ["kill"]

    @admin.display(description="priority", ordering="priority")
    def priority_shown(self, invocation):
        return invocation.priority_shown

    def get_queryset(self, request):
        return super().get_queryset(request).defer("args_blob", "result_blob")

    def has_add_permission(self, request):
        return False  # submit through the API or `lakeshore jobs submit`: admission rules apply

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # history is kept; queued ones can be killed

    @admin.action(description="Kill the selected queued invocations")
    def kill(self, request, queryset):
        run_action(
            self,
            request,
            queryset,
            "Kill",
            lambda inv: services.invocation_kill(invocation_id=inv.pk, reason="killed in admin"),
        )
