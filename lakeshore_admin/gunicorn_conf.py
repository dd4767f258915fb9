"""gunicorn's configuration for `make run` and production: threads in a few worker
processes (the `gthread` worker). A long-poll claim occupies a thread while it waits
but no database connection (it sleeps on LISTEN/NOTIFY), so threads are cheap and
plentiful; database connections come from a bounded pool per process (settings.py).

Environment: LAKESHORE_BIND and PORT (where), LAKESHORE_WEB_WORKERS (processes,
default 2), LAKESHORE_WEB_THREADS (threads per process, default 128)."""

import os
import signal
import sys

from lakeshore_admin.env import BadSetting, env_number, env_str, log_level

try:
    _port = env_number("PORT", 8080, minimum=1, maximum=65535)
    bind = f"{env_str('LAKESHORE_BIND', '127.0.0.1')}:{_port}"
    workers = env_number("LAKESHORE_WEB_WORKERS", 2, minimum=1)
    threads = env_number("LAKESHORE_WEB_THREADS", 128, minimum=1)
    loglevel = env_str("LAKESHORE_WEB_LOG_LEVEL")
    loglevel = log_level("LAKESHORE_WEB_LOG_LEVEL", loglevel, "WARNING").lower()
except BadSetting as exc:  # gunicorn would print a traceback under its own words
    sys.exit(str(exc))
worker_class = "gthread"
worker_connections = 1000
timeout = 60  # a worker silent this long is restarted (requests are bounded well below)
graceful_timeout = 25  # long-polls wait at most 20 s
keepalive = 5
wsgi_app = "lakeshore_admin.wsgi:application"
# One line per request: address, request line, status, bytes, milliseconds.
accesslog = "-"
access_log_format = '%(h)s "%(r)s" %(s)s %(B)s %(M)sms'
errorlog = "-"
# Above Django's own header limits (lakeshore_admin/middleware.py), so that Django
# answers an oversized header with its JSON error first.
limit_request_line = 8190  # gunicorn's maximum: longer filter URLs reach the app
limit_request_fields = 128  # Django refuses more than 100 itself
limit_request_field_size = 16384  # the whole "Name: value" line; Django's check is 8190


def on_starting(server):
    """The master loads the settings once, before it starts workers: they decide
    PROMETHEUS_MULTIPROC_DIR (settings.py), which the workers inherit and child_exit
    below needs."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")
    from django.conf import settings

    settings.LAKESHORE_METRICS_DIR  # noqa: B018 - loads the settings


def child_exit(server, worker):
    """A worker is gone: drop its live gauges' files (prometheus_client's multiprocess
    bookkeeping). Its counters stay: they still count towards the totals."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def post_worker_init(worker):
    """A quit signal (SIGINT, SIGQUIT) only flags the worker to stop, as SIGTERM does.
    The gthread worker's own quit handler shuts its thread pool down inside the signal
    handler: a second quit signal arriving there (Ctrl-C reaches master and workers of a
    gunicorn run in a terminal; the master then sends SIGQUIT) deadlocks on the pool's
    lock (CPython issue 121649), and the worker keeps the port for good. Flagged, the
    worker leaves its loop and shuts the pool down outside any handler; the master kills
    it after graceful_timeout at the latest, as it would have anyway (a worker's threads
    hold its exit until their requests end)."""
    signal.signal(signal.SIGINT, worker.handle_exit)
    signal.signal(signal.SIGQUIT, worker.handle_exit)
