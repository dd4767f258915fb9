from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.urls import include, path, re_path
from django.views import defaults
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from jobs import views as job_views
from lakeshore_admin.health import healthz
from queues import views as queue_views


def api_not_found(request, *args, **kwargs):
    """Unknown addresses under /api/ answer the API's error body, not an HTML page."""
    from lakeshore_admin.api_errors import error_body

    hint = "" if request.path.endswith("/") else " (API addresses end with '/')"
    message = f"No API endpoint at {request.path}{hint}; see /api/docs/."
    return JsonResponse(error_body("not_found", message), status=404)


def _json_for_api(status: int, code: str, message: str, html_view):
    def view(request, *args, **kwargs):
        if request.path.startswith("/api/"):
            from lakeshore_admin.api_errors import error_body

            return JsonResponse(error_body(code, message), status=status)
        return html_view(request, *args, **kwargs)

    return view


handler400 = _json_for_api(
    400, "invalid", "Bad request (a body over 10 MB is refused).", defaults.bad_request
)
handler500 = _json_for_api(
    500, "server_error", "The server failed; the error was logged.", defaults.server_error
)

urlpatterns = [
    path("", queue_views.queue_list, name="console-home"),
    path("jobs/", job_views.job_list, name="console-jobs"),
    path("daemons/", queue_views.daemon_list, name="console-daemons"),
    path("daemons/<int:daemon_id>/drop/", queue_views.daemon_drop, name="console-daemon-drop"),
    path("queues/<str:name>/", queue_views.queue_detail, name="console-queue"),
    path(
        "queues/<str:name>/<str:action>/",
        queue_views.queue_action,
        name="console-queue-action",
    ),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("queues.api.urls")),
    path("api/v1/", include("jobs.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    re_path(r"^api/", api_not_found),
]
