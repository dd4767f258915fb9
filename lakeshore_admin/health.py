from django.db import connection
from django.db.utils import DatabaseError
from django.http import JsonResponse
from django.views.decorators.http import require_GET


@require_GET
def healthz(request):
    """200 when the database answers, 503 otherwise (for load balancers and `make run`)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        return JsonResponse({"status": "error", "database": str(exc).strip()}, status=503)
    return JsonResponse({"status": "ok"})
