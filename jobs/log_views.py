"""The console's side of job logs (jobs/logs.py): the log on a job's page (the last
LOG_SHOWN lines of the attempt chosen), its live tail while the attempt runs, and the
whole kept log as a text file. Viewers may read them all."""

from django.http import Http404, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from accounts.console_access import console_view
from jobs import logs
from jobs.models import Invocation
from lakeshore_admin.errors import NotFound

LOG_SHOWN = 1000  # lines the page shows at first (the last ones): the rest, downloaded
TAIL_BESIDE_ERROR = 20  # a failed attempt's last lines, beside its error
MORE_LINES = 1000  # lines one refresh of the live tail brings, at most


def _number(value: str | None, *, low: int) -> int | None:
    if value in (None, ""):
        return None
    try:
        number = int(value)
    except ValueError:
        raise Http404(f"{value!r} is not a number") from None
    if not low <= number <= 2**62:
        raise Http404(f"{value!r} is out of range")
    return number


def log_context(job: Invocation, attempt_param: str | None) -> dict:
    """What the job page shows of its log: the attempt chosen (the latest by default),
    its last lines, the attempts to choose from, and for a failure its last lines."""
    try:
        attempt = _number(attempt_param, low=1)
        if attempt is not None and attempt > max(job.attempts, 1):  # not started: no page
            raise Http404(f"Job {job.pk} has had {job.attempts} attempt(s).")
        page = logs.read(job.pk, attempt=attempt, tail=LOG_SHOWN, invocation=job)
    except NotFound as exc:
        raise Http404(exc.message) from None
    output = [line for line in page["lines"] if line["stream"] in logs.STREAM_LETTERS]
    return {
        "log": page,
        "log_attempts": range(1, max(job.attempts, 1) + 1),
        "log_earlier": page["offset"] > 0,
        "log_tail": output[-TAIL_BESIDE_ERROR:] if job.error else [],
    }


@require_GET
@console_view
def job_log(request, invocation_id: int):
    """The live tail (htmx): the lines from `offset` on, and the next poll if the
    attempt may print more."""
    attempt = _number(request.GET.get("attempt"), low=1)
    offset = _number(request.GET.get("offset"), low=0) or 0
    try:
        page = logs.read(invocation_id, attempt=attempt, offset=offset, limit=MORE_LINES)
    except NotFound as exc:
        raise Http404(exc.message) from None
    return render(request, "jobs/log.html#log-more", {"log": page, "job_id": invocation_id})


@require_GET
@console_view
def job_log_text(request, invocation_id: int):
    """The attempt's whole kept log as text, one line a line (markers included)."""
    attempt = _number(request.GET.get("attempt"), low=1)
    try:
        first = logs.read(invocation_id, attempt=attempt, limit=1)
    except NotFound as exc:
        raise Http404(exc.message) from None
    response = StreamingHttpResponse(
        logs.text_lines(invocation_id, first["attempt"]), content_type="text/plain; charset=utf-8"
    )
    name = f"job-{invocation_id}-attempt-{first['attempt']}.log"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
