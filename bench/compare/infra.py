"""What every row stands on: paths, progress lines, the PostgreSQL server and its
databases, the Redis server that Celery and RQ share, free ports, the CPU time of a
process tree, stopping a process group, and the venv of its own that procrastinate is
installed in."""

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import psycopg

from lakeshore_admin import embedded_db

ROOT = Path(__file__).resolve().parents[2]
VAR = ROOT / "var"
PGDATA = VAR / "pg-bench"  # the bench's own PostgreSQL server
RUN_DIR = VAR / "bench-run"  # LAKESHORE_VAR_DIR of the bench's server, logs
BENCH_VENV = VAR / "bench-venv"  # procrastinate, apart from the project's .venv
REDIS_DIR = RUN_DIR / "redis"  # the bench's own Redis server: its socket and log
REDIS_SERVER = "/usr/bin/redis-server"  # Debian's, as .ci/run installs it
RESULTS = ROOT / "bench" / "results"
BIN = Path(sys.executable).parent  # the project's .venv/bin
PROCRASTINATE_SPEC = "procrastinate==3.10.*"

_STARTED = time.monotonic()


def progress(message: str) -> None:
    """One line, stamped with the seconds since the bench started."""
    print(f"[{time.monotonic() - _STARTED:5.0f} s] {message}", flush=True)


def wall_seconds() -> float:
    return time.monotonic() - _STARTED


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its children, from /proc (psutil)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def stop_process(process: subprocess.Popen, *, timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after `timeout` s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


# What a peer's process must not inherit: importing embedded_db sets Django's settings
# module, and Celery's worker would then set Django up (its Django fixup) for every task.
NOT_FOR_PEERS = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")


_LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _own_session_dying_with_parent() -> None:
    """In the child, before exec: a session of its own, and SIGKILL when the bench dies."""
    os.setsid()
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def start_group(command: list[str], *, env: dict[str, str], log: Path) -> subprocess.Popen:
    """`command` from the checkout's root with this environment and `env`, without
    Django's (NOT_FOR_PEERS), in a session (and process group) of its own, so that
    stop_group ends it with every process it forked; output to `log`. Its leader is
    killed by the kernel if the bench dies first (PR_SET_PDEATHSIG): even a bench
    killed with SIGKILL leaves no worker polling Redis."""
    env = {k: v for k, v in {**os.environ, **env}.items() if k not in NOT_FOR_PEERS}
    with open(log, "wb") as out:  # this run's
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_own_session_dying_with_parent,  # no other thread runs meanwhile
        )


def stop_group(process: subprocess.Popen) -> None:
    """End what start_group started, and everything its leader forked, wherever it went:
    the group is stopped first (SIGSTOP: nothing in it forks any more), its leader's
    descendants are listed (RQ's work horses start sessions of their own, so the group
    does not hold them), then the group and each of those get SIGKILL; the leader is
    reaped."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGSTOP)
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for descendant in descendants:
        with contextlib.suppress(psutil.Error):
            descendant.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)


class Redis:
    """Debian's redis-server for Celery and RQ, started by the bench on a unix socket
    under var/bench-run/redis (no TCP port, as PostgreSQL's own socket), with no
    persistence (no RDB snapshots, no append-only file), stopped at the end."""

    def __init__(self, folder: Path = REDIS_DIR):
        self.folder = folder
        self.socket = folder / "redis.sock"
        self.process: subprocess.Popen | None = None
        self.version = ""

    def start(self) -> None:
        if not Path(REDIS_SERVER).exists():
            raise RuntimeError(f"{REDIS_SERVER} is missing (Debian's package: redis-server)")
        said = subprocess.run(
            [REDIS_SERVER, "--version"], capture_output=True, text=True, check=False
        )
        found = re.search(r"v=(\S+)", said.stdout)
        self.version = found.group(1) if found else "?"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        command = [REDIS_SERVER, "--port", "0", "--unixsocket", str(self.socket)]
        command += ["--unixsocketperm", "700", "--dir", str(self.folder)]
        command += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        command += ["--databases", "4", "--loglevel", "warning"]
        with open(self.folder / "redis.log", "wb") as log:  # this run's
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited; see {self.folder / 'redis.log'}")
            if self.socket.exists():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server made no socket within 20 s")

    def url(self, db: int = 0) -> str:
        """redis-py's (and RQ's) URL of database `db`."""
        return f"unix://{self.socket}?db={db}"

    def kombu_url(self, db: int = 0) -> str:
        """Celery's broker and result backend URL of database `db`."""
        return f"redis+socket://{self.socket}?virtual_host={db}"

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, timeout=10)
        self.process = None
        self.socket.unlink(missing_ok=True)


class Postgres:
    """The embedded server under var/pg-bench (the project's embedded_db), one
    database per system on it. Stopped at the end only if this run started it."""

    def __init__(self, pgdata: Path = PGDATA):
        self.pgdata = pgdata
        self.base_url = ""
        self.started_here = False

    def start(self) -> None:
        self.started_here = not (self.pgdata / "postmaster.pid").exists()
        self.base_url = embedded_db.database_url(self.pgdata)

    def stop(self) -> None:
        if self.started_here:
            embedded_db.stop(self.pgdata)

    def url(self, database: str) -> str:
        return urlsplit(self.base_url)._replace(path=f"/{database}").geturl()

    def connect(self, database: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(self.url(database), autocommit=True)

    def version(self) -> str:
        with self.connect() as conn:
            return conn.execute("SHOW server_version").fetchone()[0]

    def create(self, database: str, *, fresh: bool) -> None:
        """Create `database` if missing; with `fresh`, drop it first."""
        ident = psycopg.sql.Identifier(database)
        with self.connect() as conn:
            if fresh:
                conn.execute(
                    psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident)
                )
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [database]
            ).fetchone()
            if not exists:
                conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(ident))


def bench_venv_python() -> tuple[Path, str]:
    """var/bench-venv with procrastinate 3.10 (and psycopg's binary build, as the
    project's .venv has), made with the project's Python if missing. Returns its
    python and procrastinate's version."""
    python = BENCH_VENV / "bin" / "python"
    probe = [str(python), "-c", "import procrastinate, importlib.metadata as m; "
             "print(m.version('procrastinate'))"]  # fmt: skip

    def installed() -> str:
        if not python.exists():
            return ""
        done = subprocess.run(probe, capture_output=True, text=True, check=False)
        version = done.stdout.strip()
        return version if done.returncode == 0 and version.startswith("3.10.") else ""

    version = installed()
    if version:
        return python, version
    progress(f"installing {PROCRASTINATE_SPEC} into {BENCH_VENV.relative_to(ROOT)}")
    if not python.exists():
        # From inside .venv, `-m venv` builds on the same base interpreter.
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", PROCRASTINATE_SPEC, "psycopg[binary]"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    version = installed()
    if not version:
        # This machine's pip config names local mirrors that may be absent: not the cause.
        why = [ln for ln in done.stderr.splitlines() if "is ignored" not in ln]
        raise RuntimeError(f"could not install {PROCRASTINATE_SPEC}: {' '.join(why)[-500:]}")
    return python, version
