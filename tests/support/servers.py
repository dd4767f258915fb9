"""The production server (gunicorn with lakeshore_admin.gunicorn_conf) for the tests
that need it, on a free port, against the test database."""

import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import httpx
import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """The test database, as DATABASE_URL names it to a server process."""
    db = connection.settings_dict
    host = db["HOST"] or ""
    if host.startswith("/"):  # a unix socket (the embedded server)
        return f"postgresql://{db['USER']}@/{db['NAME']}?host={host}"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgresql://{db['USER']}{password}@{host}{port}/{db['NAME']}"


def environment(var: Path, **settings: str) -> dict:
    """The environment of `make run`'s server on the test database, its files under
    `var`, on a free port (PORT), with `settings` (LAKESHORE_… = value) over it."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "lakeshore_admin.settings",
        "DATABASE_URL": database_url(),
        "LAKESHORE_VAR_DIR": str(var),
        "LAKESHORE_STATIC_FROM_FINDERS": "1",
        "PORT": str(free_port()),
        **settings,
    }


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
    env = {"LAKESHORE_ACCESS_LOG": "-", **env}  # its access lines in its own log
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
