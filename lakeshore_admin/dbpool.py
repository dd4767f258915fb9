"""The connection pool's check before it lends a connection, without a round trip.

psycopg_pool's stock check sends an empty query on every loan: one round trip per
request (a request borrows at its first query and returns at its end). This check asks
the connection's socket instead. A healthy idle connection has nothing to read; a
server that restarted or ended the backend (pg_terminate_backend, a crash, shutdown)
has sent its goodbye or closed the socket, which makes it readable. Then, and for a
connection idle longer than IDLE_CHECK_SECONDS (a quiet drop by a firewall sends
nothing), the stock check runs and the pool replaces a connection that fails it."""

import select
import time

from psycopg import OperationalError
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

IDLE_CHECK_SECONDS = 30.0


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
