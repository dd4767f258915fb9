"""gunicorn's configuration for `make run` and production: a few worker processes, each
an event loop (uvicorn's worker, with uvloop and httptools) serving the ASGI application
(edge/application.py). An idle daemon's long-poll waits on the loop, holding no
thread; everything else runs in a bounded pool of threads per process, with database
connections from a bounded pool per process (settings.py).

Environment: LAKESHORE_BIND and PORT (where), LAKESHORE_WEB_WORKERS (processes,
default 2), LAKESHORE_WEB_THREADS (threads per process for everything but the parked
long-polls, default 128; started as needed), LAKESHORE_ACCESS_LOG (the access log's
file, or "-" for standard output)."""

import os
import resource
import signal
import socket
import sys
from pathlib import Path

from django.conf import settings
from uvicorn_worker import UvicornWorker

from lakeshore.private import private_dir
from lakeshore_admin import metrics
from lakeshore_admin.env import BadSetting, access_log, env_number, env_str, log_level

try:
    _port = env_number("PORT", 8080, minimum=1, maximum=65535)
    bind = f"{env_str('LAKESHORE_BIND', '127.0.0.1')}:{_port}"
    workers = env_number("LAKESHORE_WEB_WORKERS", 2, minimum=1)
    env_number("LAKESHORE_WEB_THREADS", 128, minimum=1)  # read by the app (asgi.py)
    loglevel = env_str("LAKESHORE_WEB_LOG_LEVEL")
    loglevel = log_level("LAKESHORE_WEB_LOG_LEVEL", loglevel, "WARNING").lower()
except BadSetting as exc:  # gunicorn would print a traceback under its own words
    sys.exit(str(exc))


OPEN_FILES_MAX = 1_048_576  # the soft limit of open files is raised to this at most
OPEN_FILES_LOW = 8192  # below this a large fleet would not fit: say so at start


class Worker(UvicornWorker):
    """uvicorn's worker for gunicorn, with the fast loop and parser (a request's head due
    within the keep-alive: http_protocol.py), and the app's lifespan (asgi.py: a stop
    ends the parked long-polls at once)."""

    # The protocol by name: uvicorn imports it in the worker, once the app has set Django
    # up (its 408 is rendered as the site renders its errors).
    CONFIG_KWARGS = {
        "loop": "uvloop",
        "http": "edge.http_protocol:Protocol",
        "lifespan": "on",
    }

    def init_signals(self) -> None:
        """A stop signal ends the worker with SystemExit, not the signal's default
        action: uvicorn, once it has shut down gracefully, raises the signal it caught
        again under the handler it found, and the default would kill the process before
        worker_exit and atexit run (which write its last counts for /metrics)."""
        super().init_signals()
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, _exit)


def _exit(signum, frame):
    sys.exit(0)


worker_class = "lakeshore_admin.gunicorn_conf.Worker"
# Each worker listens on a socket of its own (SO_REUSEPORT), and the kernel spreads new
# connections over them. On one shared socket, a worker that wakes first accepts every
# connection waiting: when a fleet of daemons connects at once, most land on one
# process (one core), and their long-polls stay there for good.
reuse_port = True
timeout = 60  # a worker silent this long is restarted (requests are bounded well below)
graceful_timeout = 25  # a stop ends every parked wait at once (asgi.py)
# Seconds an idle connection is kept: longer than clients keep one (httpx's default, the
# Python SDK's, 5 s; lakeshore/client.py 4 s), so the client always lets go first and
# never sends a request on a connection the server is closing at that moment. A request's
# line and headers are due within it too (http_protocol.py).
keepalive = 20
wsgi_app = "lakeshore_admin.asgi:application"
# One line per request, written by uvicorn's worker in its own form (address, request
# line, status) through gunicorn's access log (gunicorn's access_log_format is not
# used), to var/log/access.log unless LAKESHORE_ACCESS_LOG says otherwise ("-": the
# terminal): a daemon's long-poll every few seconds would bury make run's own lines.
# Warnings, errors and what starts and stops stay on the terminal.
accesslog = access_log()
if accesslog != "-":
    try:
        private_dir(Path(accesslog).parent)
    except OSError as exc:
        sys.exit(
            str(
                BadSetting(
                    "LAKESHORE_ACCESS_LOG",
                    accesslog,
                    f"a file in a directory this user can create ({exc.strerror})",
                )
            )
        )
errorlog = "-"
# Above Django's own header limits (lakeshore_admin/middleware.py), so that Django
# answers an oversized header with its JSON error first.
limit_request_line = 8190  # gunicorn's maximum: longer filter URLs reach the app
limit_request_fields = 128  # Django refuses more than 100 itself
limit_request_field_size = 16384  # the whole "Name: value" line; Django's check is 8190


def on_starting(server):
    """The master loads the settings once, before it starts workers: a bad setting stops
    it here with its one line (lakeshore_admin/env.py), not in every worker. The port
    must be free (_port_is_free), and the workers may open many files (_open_files)."""
    for address in server.cfg.bind:
        _port_is_free(address)
    if warning := _open_files():
        server.log.warning(warning)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")
    settings.LAKESHORE_TICK_SECONDS  # noqa: B018 - loads the settings


def _open_files() -> str | None:
    """Each parked long-poll holds a socket, so a worker serving a large fleet needs
    thousands of descriptors, past the usual soft limit of 1,024. Raise the soft limit
    to the hard one (which only the administrator sets: systemd's default is 524,288)
    for the workers this master starts. A warning when it stays low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = OPEN_FILES_MAX if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_MAX)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < OPEN_FILES_LOW:
        return (
            f"open files are limited to {soft} a process (hard limit {hard}): each worker "
            f"can hold fewer than {soft} daemons' long-polls at once. Raise the hard limit "
            "(LimitNOFILE= in a systemd unit, ulimit -Hn)"
        )
    return None


def _port_is_free(address: str) -> None:
    """With reuse_port a second server on the same port would share it silently: refuse
    to start when the port is taken, as a server without it does."""
    host, _, port = address.rpartition(":")
    if address.startswith(("unix:", "fd://")) or not port.isdigit():
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # as gunicorn binds: a port a stopped server left in TIME_WAIT is free
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]") or "0.0.0.0", int(port)))  # noqa: S104 - a probe
        except OSError as exc:
            sys.exit(f"cannot listen at {address}: {exc.strerror} (is another server running?)")


def worker_exit(server, worker):
    """A worker stops: it writes what it counted since its last flush (/metrics)."""
    metrics.flush_at_exit()
