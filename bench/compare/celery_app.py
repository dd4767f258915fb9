"""The Celery app of the comparison and its no-op task, as its worker imports it:
`celery -A bench.compare.celery_app worker …`, started by celery_driver.py. The worker
reads from its environment:

    BENCH_CELERY_BROKER    the broker's URL (the bench's Redis, infra.Redis)
    BENCH_CELERY_BACKEND   the result backend's URL (another database of that Redis)
    BENCH_CELERY_CONFIG    "plain" (Celery's defaults) or "tuned" (TUNED below)
    BENCH_CELERY_READY     a file the worker creates once it is ready to take tasks

The bench's own side makes apps of its own with make_app (a sender with or without a
result backend); a task is sent by its name, so any of them reaches this worker."""

import os
from pathlib import Path

from celery import Celery
from celery.signals import worker_ready

TASK = "noop"

# What Celery's documentation ("Optimizing") advises for throughput of many short tasks,
# with the acknowledgement our at-least-once promise needs. The worker's command line
# adds the rest (celery_driver.worker_command).
TUNED = {
    "task_acks_late": True,  # acknowledged once run: at-least-once, as Lakeshore
    "worker_prefetch_multiplier": 64,  # "lots of short tasks: … large, say 64 or 128"
    "worker_disable_rate_limits": True,  # none is used
}


def make_app(broker: str, backend: str | None, config: str = "plain") -> Celery:
    """An app on `broker` with the no-op task, results in `backend` (None: no result
    backend), configured as `config` says (plain: Celery's defaults; tuned: TUNED)."""
    app = Celery("bench-peer", broker=broker, backend=backend, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = True  # quiets a warning, changes nothing
    if config == "tuned":
        app.conf.update(TUNED)

    @app.task(name=TASK, shared=False)
    def noop(i: int) -> None:
        return None

    return app


app = make_app(
    os.environ.get("BENCH_CELERY_BROKER", "memory://"),
    os.environ.get("BENCH_CELERY_BACKEND") or None,
    os.environ.get("BENCH_CELERY_CONFIG", "plain"),
)


@worker_ready.connect
def _ready(**_kwargs) -> None:
    ready = os.environ.get("BENCH_CELERY_READY")
    if ready:
        Path(ready).touch()
