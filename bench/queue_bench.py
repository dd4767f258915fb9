"""Throughput and latency of the job queue on this machine: prints figures, asserts
nothing. Run with `make bench` (its own embedded PostgreSQL under var/pg-bench).

    submit      one invocation per request-path call, and batches
    claim       per queue kind, at a given backlog, 1 and 4 claiming threads
    list        a page of `jobs list` at offset 0, at a deep offset, and by keyset cursor
"""

import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
if not os.environ.get("DATABASE_URL"):
    os.environ.setdefault("LAKESHORE_PGDATA", str(ROOT / "var" / "pg-bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

from accounts.services import token_create  # noqa: E402
from fleet import protocol  # noqa: E402
from fleet.models import Daemon  # noqa: E402
from jobs import services, waits  # noqa: E402
from jobs.models import Invocation  # noqa: E402
from queues.models import Queue  # noqa: E402

BACKLOG = int(os.environ.get("BENCH_BACKLOG", "20000"))
CLAIM_SECONDS = float(os.environ.get("BENCH_CLAIM_SECONDS", "3"))


def reset() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE jobs_invocation, fleet_daemon, queues_queueevent, queues_queuesample CASCADE"
        )
        cursor.execute("DELETE FROM queues_queue")
        cursor.execute("VACUUM ANALYZE jobs_invocation")


def fill(queue: str, n: int, levels: int = 5) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO jobs_invocation (queue, function, args, kwargs, priority, state,
                   attempts, max_attempts, key, reason, error, created_at)
               SELECT %s, 'x.y', '[]', '{}', g %% %s, 'queued', 0, 1, '', '', '', now()
                 FROM generate_series(1, %s) g""",
            [queue, levels, n],
        )
        cursor.execute("VACUUM ANALYZE jobs_invocation")


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f}/s"


def bench_submit() -> None:
    reset()
    Queue.objects.create(name="s")
    n = 1000
    started = time.perf_counter()
    for i in range(n):
        services.invocation_submit(function="x.y", queue="s", args=[i])
    single = time.perf_counter() - started
    Queue.objects.filter(name="s").update(max_depth=10**6)
    started = time.perf_counter()
    for i in range(n):
        services.invocation_submit(function="x.y", queue="s", args=[i])
    bounded = time.perf_counter() - started
    print(
        f"submit  one at a time: {rate(n, single)} unbounded queue, "
        f"{rate(n, bounded)} with max_depth"
    )


def _claimers(kind: str, threads: int, limit: int) -> tuple[int, float]:
    reset()
    Queue.objects.create(name="c", kind=kind)
    fill("c", BACKLOG)
    daemons = [Daemon.objects.create(name=f"d{i}", queues=["c"]) for i in range(threads)]
    total = [0] * threads
    failed: list[BaseException] = []
    deadline = time.perf_counter() + CLAIM_SECONDS

    def work(i):
        try:
            while time.perf_counter() < deadline:
                got = waits.drive(protocol.claim_steps(daemon=daemons[i], limit=limit))
                if not got:
                    break
                total[i] += len(got)
        except BaseException as exc:  # noqa: BLE001 - raised again below, not counted as 0/s
            failed.append(exc)
        finally:
            connection.close()

    started = time.perf_counter()
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if failed:
        raise failed[0]
    return sum(total), time.perf_counter() - started


def bench_claim() -> None:
    for kind in ("fifo", "priority", "boltzmann"):
        figures = []
        for threads, limit in ((1, 1), (4, 1), (4, 10)):
            n, seconds = _claimers(kind, threads, limit)
            figures.append(f"{threads} thread(s) × limit {limit}: {rate(n, seconds)}")
        print(f"claim   {kind:9} at {BACKLOG:,} queued: " + "; ".join(figures))


def bench_list() -> None:
    reset()
    fill("", BACKLOG * 5)
    _, raw = token_create(username="bench", role="viewer")
    client = Client(SERVER_NAME="localhost", HTTP_AUTHORIZATION=f"Bearer {raw}")
    client.get("/api/v1/jobs/")

    def timed(url: str) -> float:
        samples = []
        for _ in range(15):
            started = time.perf_counter()
            assert client.get(url).status_code == 200
            samples.append(time.perf_counter() - started)
        return statistics.median(samples) * 1000

    deep = BACKLOG * 5 - 100
    cursor = Invocation.objects.order_by("id").values_list("id", flat=True)[100]
    print(
        f"list    {BACKLOG * 5:,} rows, 50 a page (median of 15, whole request): "
        f"first page {timed('/api/v1/jobs/'):.1f} ms; offset {deep:,} "
        f"{timed(f'/api/v1/jobs/?offset={deep}'):.1f} ms; cursor at the same depth "
        f"{timed(f'/api/v1/jobs/?cursor={cursor}'):.1f} ms"
    )


def main() -> None:
    call_command("migrate", verbosity=0)
    print(
        f"PostgreSQL {connection.pg_version // 10000}, backlog {BACKLOG:,}, {os.cpu_count()} cores"
    )
    bench_submit()
    bench_claim()
    bench_list()
    reset()


if __name__ == "__main__":
    try:
        main()
    finally:
        from django.conf import settings

        if settings.EMBEDDED_PGDATA is not None:
            from lakeshore_admin import embedded_db

            connection.close()
            embedded_db.stop(settings.EMBEDDED_PGDATA)
