"""The pool's check before a loan (lakeshore_admin/dbpool.py): no round trip for a
healthy connection, and a connection whose backend the server ended is replaced, not
lent. The server really ends it (pg_terminate_backend)."""

import contextlib
import os
import threading
import time

import psycopg
import pytest
from django.conf import settings
from django.db import OperationalError, connection, connections
from psycopg_pool import ConnectionPool

from lakeshore_admin import dbpool
from lakeshore_admin.postgresql.base import DatabaseWrapper

pytestmark = pytest.mark.django_db


@pytest.fixture
def make_pool():
    pools = []

    def make(**options):
        kwargs = {**connection.get_connection_params(), "autocommit": True}
        pool = ConnectionPool(kwargs=kwargs, min_size=1, max_size=1, open=True, **options)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        # a replacement may still be connecting in the pool's thread: let it finish,
        # so closing the pool closes it too (no session left on the test database)
        with contextlib.suppress(Exception):
            pool.wait(timeout=5)
        pool.close()


@pytest.fixture
def stock_checks(monkeypatch):
    calls = []
    stock = ConnectionPool.check_connection

    def counted(conn):
        calls.append(conn)
        stock(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    return calls


def _backend(pool) -> int:
    with pool.connection() as conn:
        return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def _terminate(pid: int) -> None:
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
    time.sleep(0.2)  # the server's goodbye reaches the socket


def test_the_servers_pool_uses_it():
    assert settings.DATABASES["default"]["ENGINE"] == "lakeshore_admin.postgresql"  # by share
    options = settings.DATABASES["default"]["OPTIONS"]["pool"]
    assert options["check"] is dbpool.check
    # no reset callback: with one, the pool hands every returned connection to its
    # worker thread (a thread switch per request)
    assert "reset" not in options


def test_a_healthy_connection_is_lent_without_a_round_trip(make_pool, stock_checks):
    pool = make_pool(check=dbpool.check)
    first = _backend(pool)  # a new connection, never lent yet: the full check
    stock_checks.clear()
    for _ in range(5):
        assert _backend(pool) == first  # the same connection, lent again
    assert stock_checks == []


def test_a_connection_the_server_ended_is_replaced_before_it_is_lent(make_pool, stock_checks):
    pool = make_pool(check=dbpool.check)
    ended = _backend(pool)
    _terminate(ended)

    now = _backend(pool)  # a working connection, on a new backend

    assert now != ended
    assert len(stock_checks) >= 1  # the readable socket sent it to the full check


def test_without_a_check_the_ended_connection_is_lent_and_fails(make_pool):
    # negative control: what the check prevents
    pool = make_pool(check=None)
    ended = _backend(pool)
    _terminate(ended)
    with pytest.raises(psycopg.OperationalError):
        _backend(pool)


def test_a_connection_idle_for_long_gets_the_full_check(make_pool, stock_checks, monkeypatch):
    pool = make_pool(check=dbpool.check)
    _backend(pool)
    stock_checks.clear()
    monkeypatch.setattr(dbpool, "IDLE_CHECK_SECONDS", 0.0)
    time.sleep(0.01)
    _backend(pool)
    assert len(stock_checks) == 1


def test_a_connection_past_descriptor_1024_is_checked_without_a_round_trip(make_pool, stock_checks):
    """A gunicorn worker serving hundreds of daemons holds that many sockets, so its
    database connections get descriptors past 1024 (where select() cannot look)."""
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        pool = make_pool(check=dbpool.check)
        with pool.connection() as conn:
            assert conn.pgconn.socket > 1024
        stock_checks.clear()
        first = _backend(pool)
        assert _backend(pool) == first  # lent again, healthy
        assert stock_checks == []
    finally:
        for fd in held:
            os.close(fd)


# --- the general share (lakeshore_admin/postgresql: a request's share, dbpool.share) ---------


def _in_thread(share: str | None, work):
    """work(its thread's connection) in a thread serving a request of `share`, as the
    ASGI application marks one; its connection goes back to the pool at the end."""
    answer = {}

    def run():
        dbpool.share.set(share)
        own = connections["default"]  # this thread's own
        try:
            answer["value"] = work(own)
        except Exception as exc:  # noqa: BLE001 - raised again in the caller
            answer["error"] = exc
        finally:
            own.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if "error" in answer:
        raise answer["error"]
    return answer.get("value")


def _ready(own) -> int:
    own.ensure_connection()
    return 1


@pytest.fixture
def one_place(monkeypatch, settings):
    """The general share of this process made one place wide, a short wait for it."""
    settings.LAKESHORE_DB_POOL_TIMEOUT = 0.2
    share = dbpool.GeneralShare(1)
    monkeypatch.setitem(DatabaseWrapper.general_shares, "default", share)
    return share


@pytest.mark.django_db(transaction=True)
def test_a_general_requests_connection_holds_a_place_until_it_goes_back(one_place):
    held = _in_thread(dbpool.GENERAL, lambda own: _ready(own) and one_place.lent)
    assert held == 1
    assert one_place.lent == 0  # given back with the connection
    assert _in_thread(dbpool.PROTOCOL, lambda own: _ready(own) and one_place.lent) == 0
    assert _in_thread(None, lambda own: _ready(own) and one_place.lent) == 0  # no request


@pytest.mark.django_db(transaction=True)
def test_with_its_share_lent_a_general_request_fails_and_the_protocols_is_served(one_place):
    lent, done = threading.Event(), threading.Event()

    def hold(own):
        _ready(own)
        lent.set()
        done.wait(30)

    holder = threading.Thread(target=_in_thread, args=(dbpool.GENERAL, hold))
    holder.start()
    try:
        assert lent.wait(30)
        with pytest.raises(OperationalError, match="LAKESHORE_DB_POOL_RESERVE"):
            _in_thread(dbpool.GENERAL, _ready)
        assert _in_thread(dbpool.PROTOCOL, _ready) == 1
    finally:
        done.set()
        holder.join(30)
    assert one_place.lent == 0
    assert _in_thread(dbpool.GENERAL, _ready) == 1  # control: its place free again


@pytest.mark.parametrize(
    "path, share",
    [
        ("/api/v1/daemons/7/heartbeat/", dbpool.PROTOCOL),
        ("/api/v1/daemons/7/claim/", dbpool.PROTOCOL),
        ("/api/v1/daemons/7/exchange/", dbpool.PROTOCOL),
        ("/api/v1/daemons/7/complete/", dbpool.PROTOCOL),
        ("/api/v1/daemons/7/logs/", dbpool.PROTOCOL),
        ("/api/v1/daemons/7/deregister/", dbpool.PROTOCOL),
        ("/api/v1/daemons/7/commands/3/done/", dbpool.PROTOCOL),
        ("/api/v1/daemons/register/", dbpool.PROTOCOL),
        ("/v1/daemon/poll", dbpool.PROTOCOL),
        ("/v1/daemon/result-chunk", dbpool.PROTOCOL),
        ("/readyz", dbpool.PROTOCOL),
        ("/api/v1/daemons/7/exec/", dbpool.GENERAL),  # an operator's order
        ("/api/v1/daemons/7/", dbpool.GENERAL),
        ("/api/v1/daemons/", dbpool.GENERAL),
        ("/api/v1/apply/", dbpool.GENERAL),
        ("/api/v1/jobs/", dbpool.GENERAL),
        ("/v1/namespaces/default/producer/submit", dbpool.GENERAL),
        ("/readyz/more", dbpool.GENERAL),
        ("/jobs/", dbpool.GENERAL),
    ],
)
def test_each_request_borrows_from_its_share(path, share):
    assert dbpool.share_of(path) == share
