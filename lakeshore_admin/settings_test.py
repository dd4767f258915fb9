"""Settings for pytest: the same as production, but the embedded PostgreSQL (when no
DATABASE_URL is set) keeps its data apart from `make run`'s, so both can run at once.
LAKESHORE_TEST_PGDATA moves it (parallel checkouts, helper sessions)."""

import os
import shutil
from pathlib import Path

_base = Path(__file__).resolve().parent.parent
os.environ["LAKESHORE_PGDATA"] = os.environ.get(
    "LAKESHORE_TEST_PGDATA", str(_base / "var" / "pg-test")
)

# Metrics (lakeshore_admin/metrics.py): each pytest-xdist worker counts into a directory
# of its own, emptied when it starts, beside this session's database (sessions running
# at once never share one). The servers and workers a test starts inherit their test
# process's directory, unless the test gives them one; a worker does not inherit the
# xdist controller's (it is another worker's).
_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
if os.environ.get("LAKESHORE_METRICS_TEST_WORKER") != _worker:
    _pgdata = Path(os.environ["LAKESHORE_PGDATA"])
    _metrics = _pgdata.parent / f"{_pgdata.name}.metrics" / _worker
    shutil.rmtree(_metrics, ignore_errors=True)
    _metrics.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(_metrics)
    os.environ["LAKESHORE_METRICS_TEST_WORKER"] = _worker

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

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
