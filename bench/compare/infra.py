"""What every row stands on: paths, progress lines, the PostgreSQL server and its
databases, free ports, the CPU time of a process tree, and the venv of its own that
procrastinate is installed in."""

import contextlib
import os
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
