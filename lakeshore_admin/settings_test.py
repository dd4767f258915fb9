"""Settings for pytest: the same as production, but the embedded PostgreSQL (when no
DATABASE_URL is set) keeps its data apart from `make run`'s, so both can run at once.
LAKESHORE_TEST_PGDATA moves it (parallel checkouts, helper sessions)."""

import os
from pathlib import Path

_base = Path(__file__).resolve().parent.parent
os.environ["LAKESHORE_PGDATA"] = os.environ.get(
    "LAKESHORE_TEST_PGDATA", str(_base / "var" / "pg-test")
)

# Tests run many threads at once (claim races, live servers): a bigger pool per process,
# still under the server's 100 connections for two xdist workers.
os.environ.setdefault("LAKESHORE_DB_POOL_MAX", "40")
os.environ.setdefault("LAKESHORE_STATIC_FROM_FINDERS", "1")
# Messages to the Celery worker (a submit's wake of the controller) stay in the process
# that sends them, unless a test starts a worker with a broker of its own: a test never
# writes into `make run`'s broker, and a wake never runs a tick a test did not ask for.
os.environ.setdefault("LAKESHORE_BROKER_URL", "memory://")
# Tests revoke tokens and change roles, then expect the next request to know at once.
os.environ.setdefault("LAKESHORE_TOKEN_CACHE_SECONDS", "0")
os.environ.setdefault("LAKESHORE_CREDENTIAL_CACHE_SECONDS", "0")

from lakeshore_admin.settings import *  # noqa: E402,F403

STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # noqa: F405 - WhiteNoise warns when absent

# Metrics (lakeshore_admin/metrics.py): no flush thread and no flush at exit in the test
# process, so that its counts reach the table only through a scrape it serves, inside
# the test's transaction (rolled back with it). The servers a test starts flush as in
# production, into the test's database.
LAKESHORE_METRICS_FLUSH_THREAD = False

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
