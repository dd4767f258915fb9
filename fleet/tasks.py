"""Celery adapters: the controller's tick and the reaper. Safe to run twice at once
(advisory locks, conditional changes)."""

from celery import shared_task
from celery.signals import worker_shutdown

from fleet import controller, daemons
from fleet.driver_base import DRIVERS
from fleet.models import Provider

# How long a stopping worker waits for the local provider's daemons it started: an idle
# one leaves within a second or two of its SIGTERM (it tells the server it drains, which
# ends its waiting claim at once). `make run` gives the worker 11 s in all (scripts/run.py).
LOCAL_DAEMONS_STOP_SECONDS = 9


@shared_task(name="fleet.tick", ignore_result=True)
def tick() -> dict:
    """The beat's tick: once an interval, whichever server's beat fires first."""
    if not controller.beat_due("tick"):
        return {"beat": "another beat ticked within the interval"}
    return controller.tick()


@shared_task(name="fleet.wake", ignore_result=True)
def wake(queue_name: str) -> None:
    """A submit found no live daemon for an elastic queue (jobs/serving.py)."""
    controller.wake(queue_name)


@shared_task(name="fleet.reap", ignore_result=True)
def reap() -> dict:
    return daemons.reap()


@worker_shutdown.connect
def stop_local_daemons(**kwargs) -> None:
    """The worker stops after the daemons it started have deregistered (fleet/drivers.py,
    LocalDriver.stop_all), while the web server still answers them."""
    DRIVERS[Provider.Kind.LOCAL].stop_all(timeout=LOCAL_DAEMONS_STOP_SECONDS)
