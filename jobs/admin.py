from django.contrib import admin

from jobs.models import Invocation


@admin.register(Invocation)
class InvocationAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "function",
        "queue",
        "state",
        "priority",
        "daemon",
        "attempts",
        "created_at",
    ]
    list_filter = ["state", "queue"]
    search_fields = ["function", "key"]
    list_select_related = ["daemon"]
    show_full_result_count = False  # no COUNT(*) over every invocation
    readonly_fields = [
        "state",
        "daemon",
        "attempts",
        "result",
        "error",
        "created_at",
        "started_at",
        "finished_at",
    ]
