"""Request headers with a limit Django answers itself.

The app server refuses a huge request line or header before Django sees it, with a
bare page of its own. Django's limits sit below the server's (see README, Deploying),
so an oversized header gets 431 here: the API's error body under /api/, a small page
elsewhere."""

from urllib.parse import quote, urlsplit

from django.conf import settings
from django.http import HttpResponse
from django.utils.cache import patch_vary_headers

from lakeshore_admin.api_errors import error_response

MAX_HEADERS_TOTAL = 32 * 1024
MAX_HEADER_FIELDS = 100


def _headers(meta):
    for key, value in meta.items():
        if key.startswith("HTTP_"):
            yield key[5:].replace("_", "-").title(), value
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            yield key.replace("_", "-").title(), value


def header_problem(meta) -> str | None:
    """What is too large about these request headers, or None."""
    per_value = settings.LAKESHORE_MAX_HEADER_BYTES
    total_limit = max(MAX_HEADERS_TOTAL, per_value)
    total = count = 0
    for name, value in _headers(meta):
        size = len(value) if isinstance(value, str) else 0  # WSGI: latin-1, one char a byte
        if size > per_value:
            return f"the {name} header is {size} bytes (at most {per_value})"
        total += len(name) + size + 4  # "Name: value\r\n"
        count += 1
    if total > total_limit:
        return f"the headers come to {total} bytes (at most {total_limit})"
    if count > MAX_HEADER_FIELDS:
        return f"{count} header fields (at most {MAX_HEADER_FIELDS})"
    return None


class RequestHeaderLimitMiddleware:
    """431 when one header value exceeds LAKESHORE_MAX_HEADER_BYTES, the headers
    together exceed 32 KiB, or there are more than 100 of them."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if problem := header_problem(request.META):
            message = f"Request header fields too large: {problem}."
            title = "Request Header Fields Too Large (431)"
            return error_response(request, 431, "too_large", message, title)
        return self.get_response(request)


class HtmxLoginRedirectMiddleware:
    """Every answer varies on HX-Request and HX-Target (a page and its partial share an
    address). And a console refresh (an htmx request) after the session ended would follow the
    redirect to the login page and swap the whole login page into a box of the page.
    Instead it answers 204 with HX-Redirect: htmx then loads the login page as the whole
    page, which returns to the page the user was on after logging in."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):

        response = self.get_response(request)
        # A page and its htmx partial share an address: caches (the browser's, for a
        # reload after Back) must keep them apart.
        patch_vary_headers(response, ("HX-Request", "HX-Target"))
        if request.headers.get("HX-Request") != "true" or response.status_code not in (301, 302):
            return response

        if urlsplit(response.get("Location", "")).path != settings.LOGIN_URL:
            return response
        current = urlsplit(request.headers.get("HX-Current-URL", ""))
        page = current.path or "/"
        if current.query:
            page += f"?{current.query}"
        answer = HttpResponse(status=204)
        answer["HX-Redirect"] = f"{settings.LOGIN_URL}?next={quote(page)}"
        return answer
