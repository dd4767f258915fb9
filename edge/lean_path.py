"""The lean path: the daemon protocol's hot requests and submit, served without
Django's middleware stack and DRF's dispatch.

A daemon claims, reports and heartbeats many times a second; the middleware, URL
resolving and DRF's request wrapping cost more than the answer itself. It stays while
figures of `make bench` defend it: the section "The serving door" (the claim and the
exchange, through it and through the full framework) and the "N idle daemons" rows
run with LAKESHORE_LEAN_PATH=0 (an idle fleet's server CPU); the figures and the
decision: docs/decisions/0002-the-lean-path.md. This WSGI wrapper
(lakeshore_admin/wsgi.py) serves the routes the apps declare for it (door "lean" in
fleet/api/routes.py and jobs/api/routes.py: submit and batch submit, a daemon's claim,
exchange, completion and heartbeat) through the answer functions they name, the DRF
views' own (the rules, the validation, the services, the serializers, the error bodies
of api_errors). It takes a request only when it is sure to answer as the full stack would, and hands
everything else to Django, unchanged:

- JSON only (msgpack and forms go to DRF's parsers), a Host in ALLOWED_HOSTS, headers
  within RequestHeaderLimitMiddleware's limits, a body within Django's limit and the
  JSON limits (nesting, values), no API rate limit configured (LAKESHORE_API_RATE:
  DRF throttles), no DISALLOWED_USER_AGENTS or PREPEND_WWW (CommonMiddleware's), and
  over HTTPS when LAKESHORE_HTTPS redirects plain HTTP;
- a bearer token that authenticates (accounts/authentication.authenticate_token, the
  rule DRF's authentication uses): a bad one goes the full way, which counts bad
  tokens and answers 401 or 429;
- the role the view's permission class asks for (else DRF says 403).

The token and the role are checked before a byte of the body is read: a request
refused for either goes to Django with its body unread, and DRF refuses it before
its parsers run, so a stranger's body is never read or parsed (tests/edge/
test_token_before_body.py). So is the daemon's: a token that may not speak for the
daemon of the path is answered 403 not_your_daemon here, its body unread
(refused_before_body; tests/edge/test_json_body_cost_server.py).

Its answers carry the headers the middleware adds, found by Django's own response path:
a blank answer run once through settings.MIDDLEWARE (middleware_headers), not a copy of
what each middleware does (tests/edge/test_fastpath.py compares both ways request by
request). ACCOUNTED lists every middleware of
settings.MIDDLEWARE with what stands in for it here: one it does not list turns the
lean path off, and tests/edge/test_fastpath_contract.py fails until it is listed; the
same test turns on each of Django's security settings and compares the headers.

It sends Django's request_started and request_finished signals, so database
connections go back to the pool as after any request (the ASGI door gives back a worker
thread's after each turn instead, and sends none on its event loop: asgi.py), and it
keeps the request where the audit trail reads who acts.
LAKESHORE_LEAN_PATH=0 turns it off: the requests it would take are Django's and DRF's
(under the edge, a claim's wait is parked all the same: jobs/api/long_poll.py)."""

import functools
import io
import json
import logging
from http import HTTPStatus

from django.conf import settings
from django.core import signals
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.handlers.wsgi import WSGIRequest
from django.http import HttpHeaders, HttpResponse
from django.http.request import split_domain_port, validate_host
from django.utils.module_loading import import_string
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.utils import json as drf_json

from accounts import audit
from accounts.authentication import authenticate_token, kept_token
from edge.routes import hot_route
from lakeshore_admin.api_errors import exception_handler
from lakeshore_admin.middleware import header_problem
from lakeshore_admin.parsers import refusal
from lakeshore_admin.urls import handler500

log = logging.getLogger("django.request")

# Every middleware of settings.MIDDLEWARE, and what stands in for it on the requests the
# lean path takes. A middleware that is not listed turns the lean path off (a warning
# names it), so a new one is never skipped unseen; tests/edge/test_fastpath_contract.py
# fails until it is listed here.
ACCOUNTED = {
    "django.middleware.security.SecurityMiddleware": (
        "its headers: middleware_headers, for the answer's scheme; "
        "plain HTTP under SECURE_SSL_REDIRECT goes to Django"
    ),
    "whitenoise.middleware.WhiteNoiseMiddleware": "serves STATIC_URL only, never /api/",
    "django.middleware.csp.ContentSecurityPolicyMiddleware": (
        "both policies, SECURE_CSP and SECURE_CSP_REPORT_ONLY: middleware_headers"
    ),
    "lakeshore_admin.middleware.RequestHeaderLimitMiddleware": (
        "header_problem(): headers over a limit go to Django"
    ),
    "django.contrib.sessions.middleware.SessionMiddleware": (
        "a bearer token never reads the session: no cookie, no Vary: Cookie"
    ),
    "django.middleware.common.CommonMiddleware": (
        "the lean routes end in a slash; DISALLOWED_USER_AGENTS or PREPEND_WWW set: "
        "everything goes to Django; Content-Length is set"
    ),
    "django.middleware.csrf.CsrfViewMiddleware": "DRF's views are CSRF-exempt for a token",
    "django.contrib.auth.middleware.AuthenticationMiddleware": "the token's user",
    "django.contrib.messages.middleware.MessageMiddleware": "the API adds no message",
    "lakeshore_admin.middleware.HtmxLoginRedirectMiddleware": (
        "its Vary: middleware_headers; an API answer never redirects"
    ),
    "django.middleware.clickjacking.XFrameOptionsMiddleware": "X-Frame-Options: middleware_headers",
    "django_htmx.middleware.HtmxMiddleware": "request.htmx: the API does not read it",
    "accounts.audit.AuditMiddleware": "audit.serving(request) around the answer",
    "axes.middleware.AxesMiddleware": "console logins only; a bad token goes to Django",
}


def unaccounted(middleware) -> list[str]:
    """The middleware the lean path does not know how to stand in for."""
    return [name for name in middleware if name not in ACCOUNTED]


def _permitted(request, view) -> bool:
    """Whether the view's own permission classes let `request` in."""
    return all(permission().has_permission(request, None) for permission in view.permission_classes)


class LeanRequest:
    """What the answer functions, permission classes and the audit trail read of a
    request: its user, method, path and headers."""

    def __init__(self, environ, user, token):
        self.environ = self.META = environ  # META: as a Django request names it
        self.method = environ.get("REQUEST_METHOD", "POST")  # GET: the ASGI doors' reads
        self.path = environ.get("PATH_INFO", "")
        self.user = user
        self.auth = token
        self._headers = None

    @property
    def headers(self):
        if self._headers is None:
            self._headers = HttpHeaders(self.environ)
        return self._headers


class LeanPath:
    def __init__(self, app):
        self.app = app
        self._admitted_once = False  # kept_request: the first request is admitted in a thread
        self._renderer = JSONRenderer()
        self._checked = self._accounted = None
        self._middleware_headers: dict[bool, list[tuple[str, str]]] = {}
        # the middleware known (and its headers found) as it starts, not on its first
        # answer, which would wait for them; again after a setting changes (tests)
        self._enabled()
        signals.setting_changed.connect(self._forget_settings)

    def _forget_settings(self, **_kwargs) -> None:
        self._checked = None

    def __call__(self, environ, start_response):
        taken = self.take(environ)
        if taken is None:
            return self.app(environ, start_response)
        admitted = self.admit(environ, taken)
        if admitted is None:
            return self.app(environ, start_response)  # the body unread: DRF refuses first
        request, view, answer = admitted
        route, args, secure = taken
        refused = self.refused_before_body(request, route, args)
        if refused is not None:  # not its daemon: answered, the body unread
            signals.request_finished.send(sender=self.__class__)
            return self.respond(start_response, refused, secure, allow(view))
        data = read_body(environ)  # only now: the caller is known and may act
        if data is TO_DJANGO:
            return self.app(environ, start_response)
        outcome = self.outcome(request, lambda: answer(request, *args, data))
        return self.respond(start_response, outcome, secure, allow(view))

    def take(self, environ):
        """(its route, the view's arguments, secure) when the lean path may answer the
        request (a route the apps declare for it: edge/routes.py), else None. The
        request line and headers only: no database, no body."""
        if not self._enabled():
            return None
        found = hot_route(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", ""))
        if found is None or found[0].door != "lean":
            return None
        route, arguments = found
        if route.on_arrival is not None:  # before its credential is read
            route.on_arrival(environ, **arguments)
        taken = self._take(environ)
        if taken is None:
            return None
        return route, tuple(arguments.values()), taken[1]

    def admit(self, environ, taken):
        """(request, its DRF view, the answer function) when the bearer token
        authenticates and has the view's role, else None (Django answers, and says
        why). The body is still unread. Sends request_started."""
        route = taken[0]
        request = self.admit_to(environ, route.view)
        return None if request is None else (request, route.view, route.answer)

    def admit_to(self, environ, view):
        """The request, when its bearer token authenticates and has `view`'s role, else
        None. Sends request_started."""
        self._admitted_once = True
        raw = environ["HTTP_AUTHORIZATION"].split()[1]
        signals.request_started.send(sender=self.__class__, environ=environ)
        try:
            user, token = authenticate_token(raw)
        except Exception:  # noqa: BLE001 - refused, or the database: DRF answers it
            return None
        request = LeanRequest(environ, user, token)
        return request if _permitted(request, view) else None  # else DRF says 403, and why

    def kept_request(self, environ, view):
        """admit_to, when this process keeps the request's token (accounts.
        authentication.kept_token) and it has `view`'s role: no query, so the event
        loop may ask. Else None, and admit_to (in a worker thread) decides. It sends no
        request_started: its receivers tidy the calling thread's database connections,
        and the event loop has none (each worker-thread turn gives its own back:
        edge/application.Application.run)."""
        if not self._admitted_once:
            return None  # the first request is admitted in a thread, which loads its code
        kept = kept_token(environ["HTTP_AUTHORIZATION"].split()[1])
        if kept is None:
            return None
        request = LeanRequest(environ, *kept)
        return request if _permitted(request, view) else None

    def refused_before_body(self, request, route, args, *, known_only: bool = False):
        """None when the admitted request may go on to its body. Else what it is
        answered with its body unread: the outcome of a daemon's credential on another
        daemon's id (403 not_your_daemon: fleet/api/protocol_views.before_body); or, with
        `known_only` (the event loop asks), ASK_IN_THREAD when deciding takes a query."""
        if route.before_body is None:
            return None
        try:
            known = route.before_body(request, *args, known_only=known_only)
        except Exception as exc:  # noqa: BLE001 - the API's error body, as DRF's views
            return self.error(exc, request)
        return None if known else ASK_IN_THREAD

    def _enabled(self) -> bool:
        middleware = settings.MIDDLEWARE
        if middleware is not self._checked:  # once per list (tests swap it)
            self._checked, self._accounted = middleware, not unaccounted(middleware)
            self._middleware_headers = through_middleware()
            if not self._accounted:
                log.warning(
                    "the lean path is off: it does not account for %s (see ACCOUNTED in %s)",
                    ", ".join(unaccounted(middleware)),
                    __name__,
                )
        return bool(self._accounted and settings.LAKESHORE_LEAN_PATH)

    # ------------------------------------------------------------------ who may take it

    def headers_allow(self, environ, media_type: str):
        """_take for another door: (bearer token, secure), or None."""
        if not self._enabled():
            return None
        return self._take(environ, media_type)

    def _take(self, environ, media_type: str = "application/json"):
        """(bearer token, secure) when the lean path may answer, else None. It reads
        the headers only: the body is read after the token (read_body). `media_type`:
        the body's (the SDK's door takes msgpack: edge/application.py)."""
        media, _, params = environ.get("CONTENT_TYPE", "").partition(";")
        if media.strip().lower() != media_type or params.strip().lower() not in (
            "",
            "charset=utf-8",
        ):
            return None  # another type or charset: DRF's parsers read it
        if "HTTP_TRANSFER_ENCODING" in environ:
            return None  # a body without a length: Django's way of reading it
        if settings.LAKESHORE_API_RATE or settings.DISALLOWED_USER_AGENTS or settings.PREPEND_WWW:
            return None  # DRF's throttles, CommonMiddleware's refusal or redirect
        secure = is_secure(environ)
        if settings.SECURE_SSL_REDIRECT and not secure:
            return None
        if not _host_allowed(environ) or header_problem(environ) is not None:
            return None
        header = environ.get("HTTP_AUTHORIZATION", "").split()
        if len(header) != 2 or header[0].lower() != "bearer":
            return None
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return None
        if length < 0 or length > settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
            return None
        return header[1], secure

    # ------------------------------------------------------------------ the answer

    def outcome(self, request, call, *, finished: bool = True):
        """(payload, status, extra headers) of `call()`, its errors answered as the API's
        views answer them. Ends the request (request_finished) unless `finished` is
        False (the ASGI door ends it itself)."""
        try:
            with audit.serving(request):
                try:  # a claim's or an exchange's answer adds its headers (Retry-After)
                    payload, status, *headers = call()
                except Exception as exc:  # noqa: BLE001 - the API's error body, as DRF's views
                    return self.error(exc, request)
                return payload, status, tuple(headers[0].items()) if headers else ()
        finally:
            if finished:
                signals.request_finished.send(sender=self.__class__)

    def respond(self, start_response, outcome, secure, allow):
        status, headers, body = self.rendered(outcome, secure, allow)
        start_response(f"{status} {HTTPStatus(status).phrase}", headers)
        return [body]

    def rendered(self, outcome, secure, allow):
        """(status, headers, body) of an outcome, rendered as JSON."""
        payload, status, extra = outcome
        body = self._renderer.render(payload)
        headers = self.headers(
            status, "application/json", len(body), allow=allow, secure=secure, extra=extra
        )
        return status, headers, body

    def headers(self, status, content_type, length, *, allow, secure, extra=()):
        """Every header of an answer the lean path or an edge door sends: its own
        (`content_type`, `length` unless it streams, `extra`), DRF's Allow (`allow`, the
        view's; none on a 500, which is Django's own page, nor for None) and what the
        middleware adds to an answer over HTTPS (`secure`) or plain HTTP."""
        headers = [("Content-Type", content_type)]
        if length is not None:
            headers.append(("Content-Length", str(length)))
        if allow is not None and status != 500:
            headers.append(("Allow", allow))
        headers.extend(extra)
        headers.extend(self.middleware_headers(secure))
        return headers

    def middleware_headers(self, secure: bool) -> list[tuple[str, str]]:
        """What settings.MIDDLEWARE adds to an API answer over HTTPS (`secure`) or plain
        HTTP (through_middleware: it depends on the settings and the scheme only)."""
        return self._middleware_headers[secure]

    def error(self, exc, request):
        if isinstance(exc, DjangoValidationError):
            exc = exceptions.ValidationError(
                exc.message_dict if hasattr(exc, "error_dict") else exc.messages
            )
        response = exception_handler(exc, {"request": request, "view": None})
        if response is None:  # not the API's kind of error: Django's 500, logged
            log.error(
                "Internal Server Error: %s", request.path, exc_info=exc, extra={"status_code": 500}
            )
            return json.loads(handler500(request).content), 500, ()
        if response.status_code >= 400:
            reason = HTTPStatus(response.status_code).phrase
            level = log.error if response.status_code >= 500 else log.warning
            level("%s: %s", reason, request.path, extra={"status_code": response.status_code})
        extra = tuple((k, v) for k, v in response.items() if k.lower() != "content-type")
        return response.data, response.status_code, extra


def read_body(environ):
    """The JSON body (its length already checked by _take), or TO_DJANGO when DRF's
    parser must answer it: text that is not UTF-8 or not JSON, nested too deep or
    holding too many values (lakeshore_admin/parsers.refusal). A body read is put back
    for Django."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    raw = environ["wsgi.input"].read(length) if length else b""
    if length:
        environ["wsgi.input"] = io.BytesIO(raw)  # Django reads it again if it must
    try:
        text = raw.decode("utf-8")
        if refusal(text) is not None:
            return TO_DJANGO
        return drf_json.loads(text) if text.strip() else {}  # DRF's: no NaN, no Infinity
    except (UnicodeDecodeError, ValueError):
        return TO_DJANGO


TO_DJANGO = object()  # read_body's "hand it to Django"
ASK_IN_THREAD = object()  # refused_before_body's "it takes a query: ask in a thread"


@functools.cache
def allow(view) -> str:
    """DRF's Allow header for the view (Django's setup adds HEAD to a view with GET)."""
    instance = view()
    instance.setup(None)
    return ", ".join(instance.allowed_methods)


def is_secure(environ) -> bool:
    """Whether the request came over HTTPS, as Django reads it (SECURE_PROXY_SSL_HEADER)."""
    if environ.get("wsgi.url_scheme") == "https":
        return True
    header = settings.SECURE_PROXY_SSL_HEADER
    return bool(header) and environ.get(header[0]) == header[1]


def _host_allowed(environ) -> bool:
    host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")
    if settings.USE_X_FORWARDED_HOST and "HTTP_X_FORWARDED_HOST" in environ:
        return False  # Django's way of reading it: leave it to Django
    domain, _port = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def through_middleware() -> dict[bool, list[tuple[str, str]]]:
    """The headers settings.MIDDLEWARE adds to a blank answer to a bearer token's POST to
    the API, over plain HTTP (False) and over HTTPS (True): Django's own response path,
    each middleware built by its factory around the next as Django chains them, the
    innermost answering. The answer's Content-Type and Content-Length are its own, not
    the middleware's."""
    handler = _blank
    for path in reversed(settings.MIDDLEWARE):
        handler = import_string(path)(handler)
    host = _an_allowed_host()
    found: dict[bool, list[tuple[str, str]]] = {}
    for secure in (False, True):
        if host is None:  # no Host is allowed: Django refuses every request (400) itself
            found[secure] = []
            continue
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": "/api/v1/",
            "SCRIPT_NAME": "",
            "QUERY_STRING": "",
            "SERVER_NAME": host,
            "SERVER_PORT": "443" if secure else "80",
            "HTTP_HOST": host,
            "HTTP_AUTHORIZATION": "Bearer -",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": "0",
            "wsgi.url_scheme": "https" if secure else "http",
            "wsgi.input": io.BytesIO(),
        }
        answered = handler(WSGIRequest(environ))
        found[secure] = [(k, v) for k, v in answered.items() if k.lower() not in _ANSWERS_OWN]
    return found


_ANSWERS_OWN = {"content-type", "content-length", "location"}


def _blank(request):
    """The innermost answer of through_middleware's chain: an empty one."""
    return HttpResponse()


def _an_allowed_host() -> str | None:
    """A Host that ALLOWED_HOSTS allows (as Django reads it under DEBUG when empty)."""
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    for entry in allowed:
        host = "localhost" if entry == "*" else entry.lstrip(".")
        if validate_host(host, allowed):
            return host
    return None
