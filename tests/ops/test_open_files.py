"""A server holds a socket for every parked long-poll: thousands a process with a large
fleet. Where the shell or service starts it with the usual soft limit of 1,024 open
files, gunicorn's master raises it to the hard limit before it starts its workers
(lakeshore_admin/gunicorn_conf.py), so a worker answers past 1,024 connections at once
instead of failing to accept them. Against `make run`'s own server, started under a
soft limit of 1,024."""

import asyncio
import resource
import subprocess
import sys

import psutil
import pytest

from tests.support import builders
from tests.support.servers import ROOT, environment, gunicorn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("load"),  # 1,100 connections at once
]

SOFT = 1024
CONNECTIONS = 1100
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def _hold(port: int) -> list[bytes]:
    """CONNECTIONS connections, each asks once and stays open (kept alive): the server
    holds them all at once. The status line of each answer (b"" when none came)."""

    async def one() -> tuple[bytes, asyncio.StreamWriter | None]:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST)
            line = await asyncio.wait_for(reader.readline(), 15)
            return line, writer
        except (OSError, TimeoutError):
            return b"", None

    answers = await asyncio.gather(*(one() for _ in range(CONNECTIONS)))
    for _, writer in answers:
        if writer is not None:
            writer.close()
    return [line for line, _ in answers]


def test_a_worker_holds_more_connections_than_a_soft_limit_of_1024(tmp_path):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4 * CONNECTIONS:
        pytest.skip(f"the hard limit of open files here is {hard}")
    env = environment(tmp_path, LAKESHORE_WEB_WORKERS="1")
    with gunicorn(tmp_path, env, open_files=SOFT) as (_, proc):
        workers = psutil.Process(proc.pid).children()
        limits = [worker.rlimit(psutil.RLIMIT_NOFILE)[0] for worker in workers]
        lines = builders.run_async(_hold(int(env["PORT"])))
    answered = [line for line in lines if line.startswith(b"HTTP/1.1 200")]
    assert len(answered) == CONNECTIONS, f"{len(answered)} of {CONNECTIONS} answered"
    assert workers and min(limits) > 2 * CONNECTIONS, limits


def test_a_hard_limit_too_low_for_a_fleet_is_said_at_start():
    """Under a hard limit of 2,048 the soft one goes up to it, and the master says the
    limit is low (gunicorn logs the warning before it starts its workers)."""
    script = (
        "import resource; from lakeshore_admin.gunicorn_conf import _open_files; "
        "print(_open_files()); print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 2048)),
    )
    assert done.returncode == 0, done.stderr
    warning, soft = done.stdout.strip().splitlines()
    assert soft == "2048"
    assert warning.startswith("open files are limited to 2048 a process (hard limit 2048)")
    assert "LimitNOFILE=" in warning
