"""How fast retention deletes, and whether it keeps pace with a sustained inflow: prints
figures, asserts nothing. Its own embedded PostgreSQL under var/pg-bench.

    drain      N finished invocations and N result frames past retention, one run
               without a budget (`manage.py prune`): rows/s of each kind
    sustained  finished invocations and frames falling due at RATE/s each (what a
               server running RATE jobs/s sees once retention's days have passed),
               while the sweep runs every PERIOD s with a BUDGET s budget (the beat's
               ratio, LAKESHORE_RETENTION_BUDGET_SECONDS over its interval): what is
               left due after each run

    BENCH_RETENTION_ROWS=300000 BENCH_RETENTION_RATE=1000 python bench/retention.py
"""

import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
if not os.environ.get("DATABASE_URL"):
    os.environ.setdefault("LAKESHORE_PGDATA", str(ROOT / "var" / "pg-bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from jobs.retention import retention_sweep  # noqa: E402

ROWS = int(os.environ.get("BENCH_RETENTION_ROWS", "300000"))
RATE = int(os.environ.get("BENCH_RETENTION_RATE", "1000"))
SECONDS = float(os.environ.get("BENCH_RETENTION_SECONDS", "30"))
PERIOD = float(os.environ.get("BENCH_RETENTION_PERIOD", "5"))
# the beat's ratio of budget to interval, scaled down to PERIOD
BUDGET = (
    PERIOD
    * settings.LAKESHORE_RETENTION_BUDGET_SECONDS
    / settings.LAKESHORE_RETENTION_EVERY_SECONDS
)

OLD = timezone.now() - timedelta(days=settings.LAKESHORE_RETENTION_DAYS + 1)

_INVOCATIONS = """
INSERT INTO jobs_invocation (queue, function, args, kwargs, priority, state, attempts,
                             max_attempts, key, reason, error, created_at, started_at,
                             finished_at, wire, run_config, result)
SELECT 'bench', 'm.f', '[1, 2]', '{}', 0, 'succeeded', 1, 1, '', '', '', %(at)s, %(at)s,
       %(at)s, '', '{}', '3'
  FROM generate_series(1, %(n)s)
"""
_FRAMES = """
INSERT INTO jobs_resultframe (stream, seq, data, final, created_at)
SELECT 'bench-' || %(tag)s || '-' || g, 0, '\\x00010203'::bytea, true, %(at)s
  FROM generate_series(1, %(n)s) g
"""


def insert_due(cursor, n: int, tag: str) -> None:
    cursor.execute(_INVOCATIONS, {"at": OLD, "n": n})
    cursor.execute(_FRAMES, {"at": OLD, "n": n, "tag": tag})


def due() -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM jobs_invocation WHERE finished_at < now() - interval '1 day'"
        )
        invocations = cursor.fetchone()[0]
        cursor.execute(
            "SELECT count(*) FROM jobs_resultframe WHERE created_at < now() - interval '1 day'"
        )
        return invocations, cursor.fetchone()[0]


def reset() -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_invocation, jobs_resultframe CASCADE")


def bench_drain() -> None:
    reset()
    with connection.cursor() as cursor:
        insert_due(cursor, ROWS, "drain")
        cursor.execute("VACUUM ANALYZE jobs_invocation")
        cursor.execute("VACUUM ANALYZE jobs_resultframe")
    started = time.perf_counter()
    counts = retention_sweep()
    took = time.perf_counter() - started
    total = counts["invocations"] + counts["frames"]
    print(
        f"drain      {counts['invocations']:,} invocations + {counts['frames']:,} frames "
        f"in {took:.1f} s: {total / took:,.0f} rows/s (left due: {due()})"
    )


def bench_sustained() -> None:
    reset()
    stop = threading.Event()
    inserted = [0]

    def inflow() -> None:
        # a second's worth at a time, every second: RATE finished jobs falling due
        tick = time.monotonic()
        with connection.cursor() as cursor:
            while not stop.is_set():
                insert_due(cursor, RATE, str(inserted[0]))
                inserted[0] += RATE
                tick += 1.0
                stop.wait(max(0.0, tick - time.monotonic()))
        connection.close()

    thread = threading.Thread(target=inflow)
    thread.start()
    print(
        f"sustained  {RATE:,} invocations/s + {RATE:,} frames/s falling due for {SECONDS:.0f} s; "
        f"a run every {PERIOD:g} s with a {BUDGET:.2f} s budget "
        f"(the beat: {settings.LAKESHORE_RETENTION_BUDGET_SECONDS:g} s "
        f"every {settings.LAKESHORE_RETENTION_EVERY_SECONDS:g} s)"
    )
    end = time.monotonic() + SECONDS
    deleted = swept = 0.0
    try:
        while time.monotonic() < end:
            time.sleep(PERIOD)
            started = time.perf_counter()
            counts = retention_sweep(budget=BUDGET)
            took = time.perf_counter() - started
            deleted += counts["invocations"] + counts["frames"]
            swept += took
            left = due()
            print(
                f"  run: {counts['invocations']:,} invocations + {counts['frames']:,} frames "
                f"in {took:.2f} s; left due after it: {left[0]:,} + {left[1]:,}"
            )
    finally:
        stop.set()
        thread.join()
    rate = deleted / swept
    duty = settings.LAKESHORE_RETENTION_BUDGET_SECONDS / settings.LAKESHORE_RETENTION_EVERY_SECONDS
    print(
        f"sustained  {rate:,.0f} rows/s while sweeping; "
        f"{inserted[0] * 2:,} rows fell due, {deleted:,.0f} deleted; "
        f"the beat's budget keeps pace up to ~{rate * duty / 2:,.0f} jobs/s "
        f"(an invocation and a frame each)"
    )


def main() -> None:
    call_command("migrate", verbosity=0)
    print(f"PostgreSQL {connection.pg_version // 10000}, {os.cpu_count()} cores")
    bench_drain()
    bench_sustained()
    reset()


if __name__ == "__main__":
    try:
        main()
    finally:
        if settings.EMBEDDED_PGDATA:
            from lakeshore_admin import embedded_db  # the bench's own server: stop it

            embedded_db.stop(settings.EMBEDDED_PGDATA)
