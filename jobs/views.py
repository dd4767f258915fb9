"""Console pages for jobs: the same FilterSet and keyset order as the API's list."""

from django.shortcuts import render
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from jobs.filters import InvocationFilter
from jobs.models import Invocation, InvocationState
from queues.views import console_view

PAGE_SIZE = 50


@require_GET
@console_view
def job_list(request):
    filterset = InvocationFilter(request.GET, queryset=Invocation.objects.light().order_by("-id"))
    valid = filterset.is_valid()
    rows = list(filterset.qs[: PAGE_SIZE + 1]) if valid else []
    next_url = None
    if len(rows) > PAGE_SIZE:  # keyset: fast at any depth
        params = request.GET.copy()
        params["cursor"] = rows[PAGE_SIZE - 1].pk
        next_url = f"?{urlencode(params, doseq=True)}"
    template = "jobs/invocation_list.html"
    if request.htmx and request.htmx.target == "job-table":
        template += "#job-table"
    return render(
        request,
        template,
        {
            "jobs": rows[:PAGE_SIZE],
            "next_url": next_url,
            "errors": None if valid else filterset.errors,
            "states": InvocationState.choices,
            "chosen": request.GET.getlist("state"),
            "queue": request.GET.get("queue", ""),
        },
    )
