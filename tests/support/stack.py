"""What `make run` runs, for the tests that need all of it against the test database:
gunicorn (the production configuration) and one Celery worker with beat, sharing a
broker, with the `local` provider's daemons pointed at that gunicorn."""

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.servers import database_url, free_port, gunicorn

ROOT = Path(__file__).resolve().parents[2]
BROKERS = ["filesystem://"]
if os.environ.get("LAKESHORE_TEST_REDIS_URL"):  # .ci/run starts a Redis server
    BROKERS.append(os.environ["LAKESHORE_TEST_REDIS_URL"])


def environment(tmp_path: Path, *, broker: str, tick_seconds: int, port: int) -> dict:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "lakeshore_admin.settings",
        "DATABASE_URL": database_url(),
        "LAKESHORE_DB_POOL_MAX": "6",
        "LAKESHORE_VAR_DIR": str(tmp_path / "var"),
        "LAKESHORE_STATIC_FROM_FINDERS": "1",
        "LAKESHORE_WEB_WORKERS": "1",
        "LAKESHORE_BROKER_URL": broker,
        "LAKESHORE_TICK_SECONDS": str(tick_seconds),
        "LAKESHORE_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "PORT": str(port),
        "PYTHONWARNINGS": "ignore",
    }


def _stop_tree(proc: subprocess.Popen) -> None:
    """The worker and every process it started (the local provider's daemons)."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    psutil.wait_procs(children, timeout=15)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    if proc.poll() is None:
        proc.terminate()
    proc.wait(20)


@contextlib.contextmanager
def running(tmp_path: Path, *, broker: str = "filesystem://", tick_seconds: int = 3600):
    """Yields (base URL, the worker's log path) once gunicorn answers and the worker is
    ready; stops both, and the daemons the worker started, at the end."""
    env = environment(tmp_path, broker=broker, tick_seconds=tick_seconds, port=free_port())
    log_path = tmp_path / "celery.log"
    with gunicorn(tmp_path, env, ready="/readyz") as (base, _):
        log = open(log_path, "w")  # noqa: SIM115 - closed below
        worker = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "celery"),
                "-A",
                "lakeshore_admin",
                "worker",
                "-B",
                "--pool=solo",
                "--loglevel=info",
                f"--hostname=stack-{os.getpid()}-{env['PORT']}@%h",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while " ready." not in log_path.read_text():
                if worker.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("the Celery worker did not start:\n" + log_path.read_text())
                time.sleep(0.1)
            yield base, log_path
        finally:
            _stop_tree(worker)
            log.close()
