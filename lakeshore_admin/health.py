"""Probes for load balancers, orchestrators and `make run`. Neither says more than
its status: no exception text, socket path or host reaches an anonymous caller; the
reason a check failed goes to the log."""

import logging

from django.db import connection
from django.db.utils import DatabaseError
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

logger = logging.getLogger(__name__)


@never_cache
@require_safe
def healthz(request):
    """Liveness: 200 whenever this web process answers. It touches no database, so a
    database outage never gets the web processes restarted."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_safe
def readyz(request):
    """Readiness: 200 when the database answers, else 503 (take this process out of
    rotation; `make run` waits for it before printing its banner)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        logger.warning("readyz: the database does not answer", exc_info=True)
        body = {"status": "unavailable", "checks": {"database": "unavailable"}}
        return JsonResponse(body, status=503)
    return JsonResponse({"status": "ready"})
