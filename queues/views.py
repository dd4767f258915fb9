"""Console pages (HTML). The lists use the same FilterSet and QuerySet as the API."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

from queues.filters import QueueFilter
from queues.models import Queue, QueueState

PAGE_SIZE = 100


@require_GET
@login_required
def queue_list(request):
    filterset = QueueFilter(request.GET, queryset=Queue.objects.for_list())
    queues = filterset.qs if filterset.is_valid() else Queue.objects.none()
    try:
        offset = max(0, int(request.GET.get("offset", 0)))
    except ValueError:
        offset = 0
    rows = list(queues[offset : offset + PAGE_SIZE + 1])
    template = "queues/queue_list.html"
    if request.htmx:
        template += "#queue-table"
    return render(
        request,
        template,
        {
            "queues": rows[:PAGE_SIZE],
            "next_offset": offset + PAGE_SIZE if len(rows) > PAGE_SIZE else None,
            "page_size": PAGE_SIZE,
            "state": filterset.form.cleaned_data.get("state") if filterset.is_valid() else "",
            "states": QueueState.choices,
        },
    )
