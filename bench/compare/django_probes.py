"""The measurements made inside Django rather than over HTTP. Runs with the project's
.venv and the bench server's environment (DATABASE_URL = the bench database), as
`python -m bench.compare.django_probes`, serving JSON lines (lines.py).

    tick_setup {queues, daemons}  a `simulated` provider, `queues` queues with fixed
                                  elasticity at their size, `daemons` idle daemons
                                  spread over them (bulk_create: SQL, no API)
    tick                          one fleet.controller.tick() over all of it
    tick_cleanup                  remove it all
    claim_kinds {seconds}         the per-kind claim figures of bench/queue_bench.py
    tick_seconds                  LAKESHORE_TICK_SECONDS (how often beat reaps)
    reap                          one fleet.daemons.reap(), as beat's `reap` task"""

import contextlib
import io
import os
import time

import django

django.setup()  # run as a script (python -m): the settings come from the environment
from django.conf import settings  # noqa: E402 - the models need django.setup() first
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.compare.lines import serve  # noqa: E402
from fleet import controller, daemons  # noqa: E402
from fleet.models import Daemon, DaemonState, Provider  # noqa: E402
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
        now = timezone.now()
        Daemon.objects.bulk_create(
            (
                Daemon(
                    name=f"{names[i % queues]}-d{i}",
                    queues=[names[i % queues]],
                    state=DaemonState.IDLE,
                    provider=provider,
                    last_heartbeat_at=now,
                )
                for i in range(per_queue * queues)
            ),
            batch_size=2000,
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
