"""The production server (gunicorn) in a subprocess on the test database, configured
as the test's reaper is, and the test database's DATABASE_URL for it."""

import contextlib
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[3]

# The server and the test's reaper use the same short timeout: the server writes a
# heartbeat at most every min(LAKESHORE_HEARTBEAT_WRITE_SECONDS, timeout / 4) s, so
# with its default (60 s) it would write every 5 s and the reaper would lose live daemons.
HEARTBEAT_TIMEOUT = 2  # s
WEB_WORKERS = 2
DB_POOL_MAX = 12  # per web process


_ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) [^"]*" (?P<status>\d{3}) ')


class Server:
    """`make run`'s gunicorn (lakeshore_admin/gunicorn_conf.py: gthread workers, a
    bounded pool per process) in a subprocess on the test database, configured as the
    test's reaper is (heartbeat timeout, no retry back-off)."""

    def __init__(self, var_dir: Path, database: str):
        self.var_dir = var_dir
        self.log_path = var_dir / "gunicorn.log"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "LAKESHORE_ACCESS_LOG": "-",  # its access lines in its log: answers()
            "DJANGO_SETTINGS_MODULE": "lakeshore_admin.settings",
            "DATABASE_URL": database,
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),  # not two workers racing to write one
            "LAKESHORE_VAR_DIR": str(var_dir),
            "LAKESHORE_STATIC_FROM_FINDERS": "1",
            "LAKESHORE_WEB_WORKERS": str(WEB_WORKERS),
            "LAKESHORE_DB_POOL_MAX": str(DB_POOL_MAX),
            "LAKESHORE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
            "LAKESHORE_RETRY_BACKOFF": "0",
            "LAKESHORE_TOKEN_CACHE_SECONDS": "5",  # production's (the tests' settings say 0)
            "LAKESHORE_CREDENTIAL_CACHE_SECONDS": "60",  # production's too
            "LAKESHORE_API_RATE": "",  # no throttle, whatever this shell says
            "PORT": str(self.port),
        }
        self.proc: subprocess.Popen | None = None
        self.cpu = 0.0  # s of CPU of the server's processes, read at stop()
        self.started_in = 0.0

    def start(self, timeout: float = 30.0) -> None:
        began = time.monotonic()
        gunicorn = Path(sys.executable).parent / "gunicorn"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(gunicorn), "-c", "python:lakeshore_admin.gunicorn_conf"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = began + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    self.started_in = time.monotonic() - began
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"gunicorn did not come up:\n{self.log_tail()}")

    def _cpu_now(self) -> float:
        try:
            main = psutil.Process(self.proc.pid)
            procs = [main, *main.children(recursive=True)]
        except psutil.Error:
            return self.cpu
        total = 0.0
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.cpu = self._cpu_now()
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def answers(self) -> Counter:
        """Requests the server answered, by status (its access log)."""
        counts: Counter = Counter()
        with contextlib.suppress(OSError), open(self.log_path, errors="replace") as log:
            for line in log:
                match = _ACCESS.search(line)
                if match:
                    counts[match["status"]] += 1
        return counts
