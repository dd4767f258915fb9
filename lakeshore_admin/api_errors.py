"""The one place that turns errors into the API's error body:
{"error": {"code": "...", "message": "...", "fields": {...}}}, and, under /v1/ (the
Python SDK's routes), into the answer the SDK shows.

The SDK (dreamlake-lakeshore 0.5.0, http_dispatch.py) does not decode an error answer:
any status of 400 or more raises `DispatchError(f"{path} -> {status}: {r.text[:200]}")`,
the body read as text. A msgpack body shows there as bytes that are not text, so an
error under /v1/ answers one line of plain text instead: the message, then the code in
parentheses (`Queue 'gpu' is draining. (queue_not_admitting)`). The code is also in the
Lakeshore-Error-Code header, for a client that branches on it.

A validation error lists its first ERRORS_SHOWN fields and counts the rest
(`more_errors`): an answer stays small however many items a body got wrong."""

from django.conf import settings
from django.core.exceptions import DisallowedHost, PermissionDenied, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, InterfaceError, OperationalError
from django.http import Http404, HttpResponse, JsonResponse
from django.http.request import split_domain_port
from django.utils.html import format_html
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from lakeshore_admin.errors import DomainError


def error_body(code: str, message: str, fields: dict | None = None, **extra) -> dict:
    return {"error": {"code": code, "message": message, "fields": fields or {}, **extra}}


def is_api(request) -> bool:
    return request.path.startswith("/api/")


def is_sdk(request) -> bool:
    return request.path.startswith("/v1/")


SDK_CODE_HEADER = "Lakeshore-Error-Code"


def sdk_error(status: int, code: str, message: str, headers=None) -> HttpResponse:
    """An error answer under /v1/, as the SDK shows it: `message (code)`, one line of
    UTF-8 text (see the module's docstring)."""
    line = " ".join(str(message).split())  # one line: the SDK prints it inside its own
    response = HttpResponse(
        f"{line} ({code})", status=status, content_type="text/plain; charset=utf-8"
    )
    for name, value in (headers or {}).items():
        response[name] = value
    response[SDK_CODE_HEADER] = code
    return response


def sdk_answer(response) -> HttpResponse:
    """A DRF error Response of a /v1/ view (its data the error body, its headers
    Retry-After or WWW-Authenticate) as sdk_error's answer."""
    error = (response.data or {}).get("error", {}) if isinstance(response.data, dict) else {}
    headers = {name: value for name, value in response.items() if name != "Content-Type"}
    return sdk_error(
        response.status_code,
        error.get("code", "error"),
        error.get("message") or str(response.data),
        headers,
    )


def body_too_large() -> str:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE / (1024 * 1024)
    return f"The request body is too large (at most {limit:g} MB)."


def error_response(request, status: int, code: str, message: str, title: str) -> HttpResponse:
    """The error body under /api/, the SDK's text under /v1/, a small HTML page elsewhere
    (no template: this answers requests the rest of the site refused)."""
    if is_sdk(request):
        return sdk_error(status, code, message)
    if is_api(request):
        return JsonResponse(error_body(code, message), status=status)
    page = format_html(
        "<!doctype html><title>{}</title><h1>{}</h1><p>{}</p>", title, title, message
    )
    return HttpResponse(page, status=status)


def _shorten(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _claimed_host(request) -> str:
    """The host the request names, unchecked: what get_host() read and refused."""
    meta = request.META
    if settings.USE_X_FORWARDED_HOST and "HTTP_X_FORWARDED_HOST" in meta:
        return meta["HTTP_X_FORWARDED_HOST"]
    if "HTTP_HOST" in meta:
        return meta["HTTP_HOST"]
    host, port = meta.get("SERVER_NAME", ""), request.get_port()
    return host if port == ("443" if request.is_secure() else "80") else f"{host}:{port}"


def disallowed_host(request) -> str:
    host = _claimed_host(request)
    domain, port = split_domain_port(host)
    if not domain:
        return f"Host '{_shorten(host)}' is not a valid host name."
    what = "it" if not port else f"'{_shorten(domain)}'"
    return f"Host '{_shorten(host)}' is not allowed: add {what} to ALLOWED_HOSTS."


def bad_request(request, exception=None):
    """handler400: what Django answers for SuspiciousOperation and BadRequest raised
    outside the API's views (a Host not in ALLOWED_HOSTS, a body over the limit read
    by a middleware), saying which it was."""
    if isinstance(exception, RequestDataTooBig):
        return error_response(
            request, 413, "too_large", body_too_large(), "Request Too Large (413)"
        )
    if isinstance(exception, DisallowedHost):
        message = disallowed_host(request)
        return error_response(request, 400, "bad_host", message, "Bad Request (400)")
    return error_response(request, 400, "invalid", "Bad request.", "Bad Request (400)")


# An error answer lists the first ERRORS_SHOWN of a body's errors, each message cut to
# MESSAGE_SHOWN characters (a message may quote the input), and counts the rest in
# `more_errors`: a body of 190,000 bad items answered 25.7 MiB of errors (issue 29).
ERRORS_SHOWN = 20
MESSAGE_SHOWN = 1000


def _leaves(detail, prefix: str = ""):
    """DRF's nested error detail → ("field.sub", "message message") pairs, in order."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = str(key) if key != "non_field_errors" else ""
            yield from _leaves(value, f"{prefix}.{name}" if prefix and name else prefix or name)
    elif isinstance(detail, list):
        if detail and all(not isinstance(item, (dict, list)) for item in detail):
            yield prefix or "__all__", " ".join(str(item) for item in detail)
        else:
            for index, item in enumerate(detail):
                yield from _leaves(item, f"{prefix}[{index}]")
    else:
        yield prefix or "__all__", str(detail)


def _first_errors(detail) -> tuple[dict[str, str], int]:
    """({field: message} of the first ERRORS_SHOWN errors, how many more there are)."""
    shown: dict[str, str] = {}
    more = 0
    for name, message in _leaves(detail):
        if len(shown) < ERRORS_SHOWN or name in shown:
            shown[name] = _shorten(message, MESSAGE_SHOWN)
        else:
            more += 1
    return shown, more


def _summary(fields: dict[str, str], more: int = 0) -> str:
    parts = [f"{name}: {msg}" if name != "__all__" else msg for name, msg in fields.items()]
    summary = "; ".join(parts) or "Invalid input."
    return f"{summary}; and {more:,} more errors" if more else summary


def exception_handler(exc, context):
    if isinstance(exc, DataError):  # a value the database refuses: still the caller's input
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid value"
        return Response(
            error_body("invalid", f"The database refused a value: {detail}."), status=400
        )
    if isinstance(exc, (OperationalError, InterfaceError)):
        return Response(
            error_body("unavailable", "The database is unavailable; try again shortly."),
            status=503,
        )
    if isinstance(exc, RequestDataTooBig):
        return Response(error_body("too_large", body_too_large()), status=413)
    if isinstance(exc, DomainError):
        body = error_body(exc.code, exc.message, exc.fields, **exc.extra)
        wait = getattr(exc, "retry_after", None)  # errors.Busy
        headers = {"Retry-After": str(wait)} if wait else None
        return Response(body, status=exc.status, headers=headers)
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else exc.messages
        )
    if isinstance(exc, Http404):
        return Response(error_body("not_found", str(exc) or "Not found."), status=404)
    if isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields, more = _first_errors(exc.detail)
        extra = {"more_errors": more} if more else {}
        response.data = error_body("invalid", _summary(fields, more), fields, **extra)
        response.status_code = status.HTTP_400_BAD_REQUEST
        return response
    detail = getattr(exc, "detail", str(exc))
    code = getattr(exc, "default_code", "error")
    if isinstance(exc, exceptions.AuthenticationFailed) and isinstance(exc.get_codes(), str):
        code = exc.get_codes()  # token_revoked, token_expired: a daemon stops on these
    if isinstance(exc, exceptions.ParseError):
        code = "invalid"
    response.data = error_body(code, str(detail))
    return response
