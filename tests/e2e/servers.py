"""The production server (gunicorn with lakeshore_admin.gunicorn_conf) for the tests
that need it, on a free port, against the test database."""

import contextlib
import resource
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def gunicorn(
    tmp_path: Path,
    env: dict,
    *,
    ready: str = "/healthz",
    app: str | None = None,
    open_files: int | None = None,
):
    """Starts gunicorn with `env` (which must hold PORT), waits until `ready` answers
    200 (fails the test with its log after 30 s), yields (base URL, process), and stops
    it at the end. `app` ("module:name") serves a WSGI application instead of the
    configuration's ASGI one, on gunicorn's threaded worker. `open_files`: the soft limit
    of open files it starts with (as a shell's `ulimit -Sn`)."""
    log = open(tmp_path / "gunicorn.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "-c",
            "python:lakeshore_admin.gunicorn_conf",
            *(["--worker-class", "gthread", "--threads", "32", app] if app else []),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=None if open_files is None else partial(_soft_open_files, open_files),
    )
    base = f"http://127.0.0.1:{env['PORT']}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}{ready}", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            proc.kill()
            pytest.fail("gunicorn did not come up:\n" + (tmp_path / "gunicorn.log").read_text())
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(30)
        log.close()


def _soft_open_files(limit: int) -> None:
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    )
