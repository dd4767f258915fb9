from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from lakeshore_admin.health import healthz


def api_not_found(request, *args, **kwargs):
    """Unknown addresses under /api/ answer the API's error body, not an HTML page."""
    from lakeshore_admin.api_errors import error_body

    hint = "" if request.path.endswith("/") else " (API addresses end with '/')"
    message = f"No API endpoint at {request.path}{hint}; see /api/docs/."
    return JsonResponse(error_body("not_found", message), status=404)


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("queues.api.urls")),
    path("api/v1/", include("jobs.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    re_path(r"^api/", api_not_found),
]
