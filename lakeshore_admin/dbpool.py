"""The connection pool's check before it lends a connection, without a round trip.

psycopg_pool's stock check sends an empty query on every loan: one round trip per
request (a request borrows at its first query and returns at its end). This check asks
the connection's socket instead. A healthy idle connection has nothing to read; a
server that restarted or ended the backend (pg_terminate_backend, a crash, shutdown)
has sent its goodbye or closed the socket, which makes it readable. Then, and for a
connection idle longer than IDLE_CHECK_SECONDS (a quiet drop by a firewall sends
nothing), the stock check runs and the pool replaces a connection that fails it.

The pool is also shared out. A request's connections come from one of two shares: the
daemon protocol's (a daemon's heartbeat, claim, exchange, completion, logs, orders done,
registration; an SDK worker's poll, ack and result chunks) and /readyz may use the whole
pool, every other request (the console, the API, the SDK's producer) at most
LAKESHORE_DB_POOL_MAX − LAKESHORE_DB_POOL_RESERVE connections of a process at once.
However many slow requests callers send (a large apply, a bulk cancel waiting on a
row lock, a flood of reads), LAKESHORE_DB_POOL_RESERVE connections stay free for the
daemons, whose heartbeats keep them alive (a daemon without them is marked lost, and
its job fails). The ASGI application (asgi.py) says each request's share (`share`, a
context variable its worker threads inherit); the database backend
(lakeshore_admin/postgresql) takes a place of the general share before it borrows a
connection for a general request, and gives it back with the connection. Code outside
a request (a worker process, a management command, a background thread) has no share
and borrows from the whole pool, as before; so do requests the threaded WSGI server
serves (lakeshore_admin.wsgi, not what `make run` and production serve)."""

import re
import select
import threading
import time
from contextvars import ContextVar

from psycopg import OperationalError
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolTimeout

IDLE_CHECK_SECONDS = 30.0

PROTOCOL, GENERAL = "protocol", "general"
# the daemon's and the SDK worker's own requests (fleet/api/urls.py, fleet/api/sdk_urls.py;
# not exec: an operator orders it)
PROTOCOL_PATHS = re.compile(
    r"^/(?:readyz$"
    r"|v1/daemon/"
    r"|api/v1/daemons/(?:register"
    r"|[^/]+/(?:heartbeat|claim|complete|exchange|logs|deregister)"
    r"|[^/]+/commands/[^/]+/done)/$)"
)
# The share of the request this thread (or task) serves: PROTOCOL, GENERAL, or None
# outside a request.
share: ContextVar[str | None] = ContextVar("lakeshore_pool_share", default=None)


def share_of(path: str) -> str:
    """The share of the pool a request for `path` borrows from."""
    return PROTOCOL if PROTOCOL_PATHS.match(path) else GENERAL


class GeneralShare:
    """The places of the general share in this process: `size` connections lent at
    once to general requests."""

    def __init__(self, size: int):
        self.size = size
        self.lent = 0  # places taken now
        self._places = threading.BoundedSemaphore(size)
        self._count = threading.Lock()

    def take(self, timeout: float) -> None:
        """Wait up to `timeout` s for a place; none free by then: PoolTimeout (the
        pool's own error when it has no connection to lend: 503)."""
        if not self._places.acquire(timeout=timeout):
            raise PoolTimeout(
                f"no database connection free for this request in {timeout:g} s: the "
                f"{self.size} other requests may use are lent (LAKESHORE_DB_POOL_RESERVE "
                "are kept for the daemon protocol)"
            )
        with self._count:
            self.lent += 1

    def give_back(self) -> None:
        with self._count:
            self.lent -= 1
        self._places.release()


def check(conn) -> None:
    """Raise when the connection is not fit to lend (the pool then replaces it).

    How long it sat unused is counted from its previous loan (stamped here), not from
    its return: a pool with a reset callback hands every returned connection to its
    worker thread (a thread switch per request, and the connection is not free again
    until that thread has run). Counting from the loan overstates the idle time by the
    length of the previous request, so at worst a connection gets the full check a
    little early."""
    if conn.closed or conn.broken:
        raise OperationalError("the connection is closed")
    now = time.monotonic()
    idle = now - getattr(conn, "lakeshore_lent_at", float("-inf"))
    conn.lakeshore_lent_at = now
    if idle > IDLE_CHECK_SECONDS or conn.pgconn.transaction_status != TransactionStatus.IDLE:
        ConnectionPool.check_connection(conn)
        return
    # poll, not select: a worker holding hundreds of daemons' sockets has descriptors
    # past select()'s 1024, where it raises (and every loan would fail its check)
    poller = select.poll()
    poller.register(conn.pgconn.socket, select.POLLIN)
    if poller.poll(0):  # the server spoke unasked (most likely its goodbye), or hung up
        ConnectionPool.check_connection(conn)
