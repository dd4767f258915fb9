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
# Tests revoke tokens and change roles, then expect the next request to know at once.
os.environ.setdefault("LAKESHORE_TOKEN_CACHE_SECONDS", "0")

from lakeshore_admin.settings import *  # noqa: E402,F403

STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # noqa: F405 - WhiteNoise warns when absent

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
