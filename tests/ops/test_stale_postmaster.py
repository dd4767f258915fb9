"""Issue 20, "The next start after an unclean stop": a postmaster.pid left by a server
killed with kill -9 may name a pid that is now another PostgreSQL's process (pids are
reused; on these machines several servers run). The embedded server used to take that
for its own server still running, attach to a dead socket and fail after 20 s of
"connection refused". Now it recovers: a fresh server starts."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import psycopg
import pytest
from django.conf import settings

from lakeshore_admin import embedded_db

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")), reason="exercises the embedded PostgreSQL"
)


def start(pgdata: Path) -> str:
    """What a start does (in a process of its own, as make run's supervisor)."""
    code = "import sys; from pathlib import Path; from lakeshore_admin import embedded_db; "
    code += "print(embedded_db.database_url(Path(sys.argv[1])))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(pgdata)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_postmaster_pid_naming_another_servers_process_is_recovered(tmp_path):
    theirs = psutil.Process(
        int((settings.EMBEDDED_PGDATA / "postmaster.pid").read_text().split()[0])
    )
    pgdata = (tmp_path / "pg").resolve()
    start(pgdata)  # a server of our own, stopped cleanly
    stale = (pgdata / "postmaster.pid").read_text().splitlines()
    embedded_db.stop(pgdata)
    try:
        # As after a kill -9: its postmaster.pid and socket lock are left, and their pid
        # is now a live process of another server (the tests' own).
        stale[0] = str(theirs.pid)
        (pgdata / "postmaster.pid").write_text("\n".join(stale) + "\n")
        lock = pgdata / ".s.PGSQL.5432.lock"
        lock.write_text(f"{theirs.pid}\n{pgdata}\n")
        shutil.chown(lock, embedded_db.SYSTEM_USER) if os.geteuid() == 0 else None
        # The control: the old test (a live process named postgres) is fooled by it.
        assert theirs.name() == "postgres"

        url = start(pgdata)
        with psycopg.connect(url, connect_timeout=5) as connection:
            assert connection.execute("select 1").fetchone() == (1,)
        assert int((pgdata / "postmaster.pid").read_text().split()[0]) != theirs.pid
        assert theirs.is_running()  # the other server's process was left alone
    finally:
        embedded_db.stop(pgdata)
