"""The measurements made inside Django rather than over HTTP. Runs with the project's
.venv and the bench server's environment (DATABASE_URL = the bench database), as
`python -m bench.compare.django_probes`, serving JSON lines (lines.py).

    tick_setup {queues, daemons}  a `simulated` provider, `queues` queues with fixed
                                  elasticity at their size, `daemons` idle daemons
                                  spread over them (bulk_create and one INSERT …
                                  SELECT: SQL, no API)
    tick                          one fleet.controller.tick() over all of it
    tick_cleanup                  remove it all
    claim_kinds {seconds}         the per-kind claim figures of bench/queue_bench.py
    tick_seconds                  LAKESHORE_TICK_SECONDS (how often beat reaps)
    reap                          one fleet.daemons.reap(), as beat's `reap` task
    explain {paths, token}        EXPLAIN (ANALYZE, BUFFERS) of each statement on
                                  jobs_invocation that a GET of each path runs"""

import contextlib
import io
import os
import time

import django

django.setup()  # run as a script (python -m): the settings come from the environment
from django.conf import settings  # noqa: E402 - the models need django.setup() first
from django.db import connection, reset_queries  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from bench.compare.lines import serve  # noqa: E402
from fleet import controller, daemons  # noqa: E402
from fleet.models import DaemonState, Provider  # noqa: E402
from queues.models import Queue, QueueEvent  # noqa: E402

PREFIX = "tick-"


class Probes:
    def tick_setup(self, queues: int, daemons: int) -> None:
        self.tick_cleanup()
        provider = Provider.objects.create(name=f"{PREFIX}sim", kind=Provider.Kind.SIMULATED)
        per_queue = max(1, daemons // queues)
        names = [f"{PREFIX}{i:05d}" for i in range(queues)]
        Queue.objects.bulk_create(
            Queue(name=name, provider=provider, elasticity_kind="fixed", elasticity_min=per_queue)
            for name in names
        )
        # The daemons in one INSERT … SELECT: the rows bulk_create made (daemon i serves
        # queue i mod queues, named after it), without compiling a statement a batch.
        with connection.cursor() as cursor:
            cursor.execute(
                """INSERT INTO fleet_daemon (name, queues, state, provider_id, instance_type,
                       external_id, log_path, last_heartbeat_at, created_at, updated_at)
                   SELECT queue || '-d' || i, ARRAY[queue], %(state)s, %(provider)s,
                          '', '', '', now(), now(), now()
                     FROM generate_series(0, %(daemons)s - 1) i,
                          LATERAL (SELECT %(prefix)s || lpad((i %% %(queues)s)::text, 5, '0')
                                          AS queue) named
                    ORDER BY i""",
                {
                    "state": DaemonState.IDLE,
                    "provider": provider.pk,
                    "daemons": per_queue * queues,
                    "prefix": PREFIX,
                    "queues": queues,
                },
            )

    def tick(self) -> dict:
        started = time.perf_counter()
        outcome = controller.tick()
        return {"seconds": time.perf_counter() - started, "outcome": outcome}

    def tick_cleanup(self) -> None:
        QueueEvent.objects.filter(queue__name__startswith=PREFIX).delete()
        with connection.cursor() as cursor:  # 10,000 rows nothing refers to: no ORM collector
            cursor.execute(
                "DELETE FROM fleet_daemon WHERE provider_id IN "
                "(SELECT id FROM fleet_provider WHERE name = %s)",
                [f"{PREFIX}sim"],
            )
        Queue.objects.filter(name__startswith=PREFIX).delete()
        Provider.objects.filter(name=f"{PREFIX}sim").delete()

    def tick_seconds(self) -> dict:
        return {"seconds": settings.LAKESHORE_TICK_SECONDS}

    def reap(self) -> dict:
        return daemons.reap()

    def explain(self, paths: list[str], token: str) -> dict:
        """Each path requested through Django's test client (the views, filters and
        services the server runs, with the token's user), then each of its statements
        on jobs_invocation explained as it ran: {"plans": {path: [{sql, plan}]}}."""
        client = Client(headers={"Authorization": f"Bearer {token}", "Host": "127.0.0.1"})
        plans = {}
        for path in paths:
            reset_queries()  # each request starts a new log: capture from its start
            with CaptureQueriesContext(connection) as ran:
                answer = client.get(path)
            if answer.status_code != 200:
                raise RuntimeError(f"GET {path} answered {answer.status_code}")
            statements = [q["sql"] for q in ran.captured_queries if "jobs_invocation" in q["sql"]]
            plans[path] = []
            for sql in statements:
                with connection.cursor() as cursor:
                    cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")
                    plan = "\n".join(line for (line,) in cursor.fetchall())
                plans[path].append({"sql": sql, "plan": plan})
        return {"plans": plans}

    def claim_kinds(self, seconds: float) -> dict:
        os.environ["BENCH_CLAIM_SECONDS"] = str(seconds)
        from bench import queue_bench  # noqa: PLC0415 - it reads BENCH_CLAIM_SECONDS as it loads

        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            queue_bench.bench_claim()
            queue_bench.reset()
        return {"lines": printed.getvalue().splitlines()}


def main() -> None:
    serve(Probes())


if __name__ == "__main__":
    main()
