"""What issue 17 costs the claim: its statement holds the queue's row with a key share
(queue rm and claims see each other) and weighs the candidates' arguments (an answer is
bounded by LAKESHORE_CLAIM_MAX_BYTES). Prints a claim's median latency with today's
statement and with the one before issue 17, alternating claim by claim on the same
database (the machine is shared: alternating keeps the load alike), and what one claim
of large invocations costs and answers. Asserts nothing. Its own embedded PostgreSQL
(var/pg-bench), as bench/queue_bench.py.

    BENCH_CLAIMS=1000 python -m bench.claim_cost
"""

import os
import statistics
import threading
import time

from django.conf import settings
from django.core.management import call_command
from django.db import connection

from bench import queue_bench as qb  # sets up Django on the bench's own database
from fleet import protocol
from fleet.models import Daemon
from jobs import waits
from jobs.transitions import claim
from queues.models import Queue

CLAIMS = int(os.environ.get("BENCH_CLAIMS", "1000"))  # per thread, alternating

# The claim statement before issue 17: no lock on the queue's row, no bound in bytes.
BEFORE = """
WITH me AS (
    SELECT id, state FROM fleet_daemon
     WHERE id = %(daemon)s AND state = ANY(%(claiming)s)
       FOR NO KEY UPDATE
), taken AS (
    UPDATE jobs_invocation
       SET state = %(running)s, daemon_id = (SELECT id FROM me), attempts = attempts + 1,
           started_at = now(), finished_at = NULL, scheduled_at = NULL, error = ''
     WHERE id = ANY(ARRAY(
            SELECT id FROM jobs_invocation
             WHERE queue = %(queue)s AND state = %(queued)s
               AND (scheduled_at IS NULL OR scheduled_at <= now())
               AND EXISTS (SELECT 1 FROM me) {extra}
               AND (%(queue)s = ''
                    OR EXISTS (SELECT 1 FROM queues_queue q
                                WHERE q.name = %(queue)s AND q.state = ANY(%(dispatching)s)))
             ORDER BY {order}
             LIMIT %(limit)s
               FOR UPDATE SKIP LOCKED))
    RETURNING *
), marked AS (
    UPDATE fleet_daemon d SET state = %(busy)s, updated_at = now()
      FROM me
     WHERE d.id = me.id AND me.state <> %(busy)s AND EXISTS (SELECT 1 FROM taken)
)
SELECT * FROM taken
"""
NOW = claim._CLAIM_SQL
VARIANTS = {"issue 17": NOW, "before": BEFORE}


_chosen = threading.local()


class _ThreadsChoice(str):
    """In place of claim._CLAIM_SQL: the statement this thread chose."""

    def format(self, *args, **kwargs):
        return VARIANTS[getattr(_chosen, "name", "issue 17")].format(*args, **kwargs)


def latency(kind: str, threads: int, limit: int, claims: int) -> dict:
    """Per-claim latency, each thread alternating the two statements claim by claim,
    so both see the same load (this machine is shared) and the same contention."""
    qb.reset()
    Queue.objects.create(name="c", kind=kind)
    qb.fill("c", qb.BACKLOG)
    daemons = [Daemon.objects.create(name=f"d{i}", queues=["c"]) for i in range(threads)]
    seen = {name: [] for name in VARIANTS}
    names = list(VARIANTS)

    def work(i):
        try:
            for n in range(claims):
                name = names[(n + i) % 2]
                started = time.perf_counter()
                _chosen.name = name
                got = waits.drive(protocol.claim_steps(daemon=daemons[i], limit=limit))
                seen[name].append(time.perf_counter() - started)
                if not got:
                    break
        finally:
            connection.close()

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return seen


def claim_latency() -> None:
    claim._CLAIM_SQL = _ThreadsChoice(NOW)
    for kind in ("fifo", "priority"):
        for threads, limit in ((1, 1), (1, 10), (4, 10)):
            seen = latency(kind, threads, limit, CLAIMS)
            now, before = (statistics.median(seen[name]) * 1e6 for name in VARIANTS)
            print(
                f"claim  {kind:8} {threads} thread(s) × limit {limit:2}: median "
                f"{now:6,.0f} µs now, {before:6,.0f} µs before ({now / before - 1:+.1%}); "
                f"{len(seen['issue 17']):,} claims of each"
            )
    claim._CLAIM_SQL = NOW


def large(size: int = 1024 * 1024, n: int = 200, limit: int = 100) -> None:
    """One claim of `limit` over invocations of `size` bytes of arguments each."""
    for name, sql in VARIANTS.items():
        claim._CLAIM_SQL = sql
        qb.reset()
        Queue.objects.create(name="L")
        with connection.cursor() as cursor:
            cursor.execute(
                """INSERT INTO jobs_invocation (queue, function, args, kwargs, priority,
                       state, attempts, max_attempts, key, reason, error, created_at)
                   SELECT 'L', 'x.y', jsonb_build_array(md5(g::text) || repeat('x', %s)),
                          '{}', 0, 'queued', 0, 1, '', '', '', now()
                     FROM generate_series(1, %s) g""",
                [size - 38, n],
            )
        daemon = Daemon.objects.create(name="big", queues=["L"])
        protocol.forget_queue_rows()
        started = time.perf_counter()
        got = waits.drive(protocol.claim_steps(daemon=daemon, limit=limit))
        took = time.perf_counter() - started
        print(
            f"large  {name:8}: a claim of limit {limit} over {size // 1024} KiB invocations "
            f"took {took * 1000:,.0f} ms for {len(got)} of them "
            f"({len(got) * size / 1024 / 1024:,.0f} MiB; "
            f"LAKESHORE_CLAIM_MAX_BYTES {settings.LAKESHORE_CLAIM_MAX_BYTES / 1024 / 1024:g} MiB)"
        )
    claim._CLAIM_SQL = NOW


def main() -> None:
    call_command("migrate", verbosity=0)
    print(f"PostgreSQL {connection.pg_version // 10000}, backlog {qb.BACKLOG:,}, "
          f"{os.cpu_count()} cores")  # fmt: skip
    claim_latency()
    large()
    qb.reset()


if __name__ == "__main__":
    try:
        main()
    finally:
        if settings.EMBEDDED_PGDATA:
            from lakeshore_admin import embedded_db  # the bench's own server: stop it

            embedded_db.stop(settings.EMBEDDED_PGDATA)
