from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.urls import include, path, re_path
from django.utils.csp import CSP
from django.views.decorators.csp import csp_override
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerSplitView,
)
from rest_framework.permissions import AllowAny

from accounts.console_access import console_view
from accounts.permissions import ReadOrOperate
from lakeshore_admin.api_errors import bad_request, error_body, is_sdk, sdk_error
from lakeshore_admin.health import healthz, readyz
from lakeshore_admin.pages import favicon
from queues import views as queue_views
from queues.metrics import metrics_view


@csrf_exempt  # it changes nothing: a POST to a wrong address gets this 404, not CSRF's 403
def api_not_found(request, *args, **kwargs):
    """Unknown addresses under /api/ answer the API's error body, not an HTML page."""

    hint = "" if request.path.endswith("/") else " (API addresses end with '/')"
    message = f"No API endpoint at {request.path}{hint}; see /api/docs/."
    return JsonResponse(error_body("not_found", message), status=404)


@csrf_exempt  # the SDK has no CSRF cookie: its POST to a wrong address gets this answer
def sdk_not_found(request, *args, **kwargs):
    """Unknown addresses under /v1/ (the Python SDK's) answer as the SDK shows errors."""

    return sdk_error(404, "not_found", f"No SDK endpoint at {request.path}.")


def _json_for_api(status: int, code: str, message: str, html_view):
    def view(request, *args, **kwargs):
        if is_sdk(request):
            return sdk_error(status, code, message)
        if request.path.startswith("/api/"):
            return JsonResponse(error_body(code, message), status=status)
        return html_view(request, *args, **kwargs)

    return view


handler400 = bad_request  # says what it was: a bad Host, a body too large, or bad input
handler500 = _json_for_api(
    500, "server_error", "The server failed; the error was logged.", queue_views.server_error
)
handler403 = _json_for_api(403, "forbidden", "Not allowed.", queue_views.permission_denied)


def _docs(view_class, *, page: bool, **options):
    """The OpenAPI schema and its two pages. With LAKESHORE_PUBLIC_DOCS=1 anyone reads them;
    otherwise they need a read role, as the API does, through a bearer token or a console
    session. A person not logged in is sent to the login page (and back); an API client
    gets the API's 401."""

    public = view_class.as_view(permission_classes=[AllowAny], **options)
    private = view_class.as_view(permission_classes=[ReadOrOperate], **options)
    for_a_person = console_view(private)

    def view(request, *args, **kwargs):
        if settings.LAKESHORE_PUBLIC_DOCS:
            return public(request, *args, **kwargs)
        if page and "HTTP_AUTHORIZATION" not in request.META:
            return for_a_person(request, *args, **kwargs)
        return private(request, *args, **kwargs)

    policy = getattr(settings, "SECURE_CSP", None)
    if page and policy:
        # Swagger UI and ReDoc write <style> elements as they run (ReDoc cannot even start
        # without them) and ReDoc searches in a worker it makes from a blob: these two pages
        # alone allow inline styles and blob: workers. Scripts stay as strict as elsewhere.
        styles = [
            s for s in policy.get("style-src", policy.get("default-src", [])) if s != CSP.NONCE
        ]
        docs_policy = {
            **policy,
            "style-src": [*styles, CSP.UNSAFE_INLINE],
            "worker-src": [CSP.SELF, "blob:"],
        }
        view = csp_override(docs_policy)(view)
    return view


urlpatterns = [
    # The console's pages: each app lists its own (a URL namespace: "queues:detail")
    path("", include("queues.urls")),
    path("", include("jobs.urls")),
    path("", include("fleet.urls")),
    path("", include("accounts.urls")),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("favicon.ico", favicon, name="favicon"),
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("queues.api.urls")),
    path("api/v1/", include("fleet.api.urls")),
    path("api/v1/", include("jobs.api.urls")),
    path("api/v1/", include("accounts.api.urls")),
    path("api/schema/", _docs(SpectacularAPIView, page=False), name="schema"),
    # Swagger UI's start script is a file of its own (?script): no inline script, for CSP
    path(
        "api/docs/",
        _docs(
            SpectacularSwaggerSplitView,
            page=True,
            url_name="schema",
        ),
        name="swagger-ui",
    ),
    path(
        "api/redoc/",
        _docs(SpectacularRedocView, page=True, url_name="schema", template_name="api/redoc.html"),
        name="redoc",
    ),
    re_path(r"^api/", api_not_found),
    path("v1/", include("jobs.api.sdk_urls")),
    path("v1/", include("fleet.api.sdk_urls")),
    re_path(r"^v1/", sdk_not_found),
]
