"""Celery adapters: the controller's tick, a submit's wake and the reaper. Safe to run
twice at once (advisory locks, conditional changes).

A submit's wake reaches the controller through a Django signal (jobs/serving.py,
`wake_wanted`): jobs sits below fleet and may not import it, so it says what happened
and fleet decides what to do (send this module's `wake` task). The receiver is
connected when the app is ready (fleet/apps.py)."""

import logging
import threading
import time

from celery import shared_task
from celery.signals import worker_shutdown
from django.dispatch import receiver

from fleet import controller, daemons
from fleet.driver_base import DRIVERS
from fleet.models import Provider
from jobs import serving

log = logging.getLogger(__name__)

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


WAKE_EVERY = 1.0  # seconds: a process sends at most one wake a queue in this time
_sent: dict[str, float] = {}
_sent_lock = threading.Lock()


@receiver(serving.wake_wanted, dispatch_uid="fleet.wake")
def send_wake(sender, *, queue: str, **kwargs) -> bool:
    """Ask the Celery worker to decide for `queue` now. At most one a queue every
    WAKE_EVERY seconds from a process (a burst of submits sends one); a broker that
    cannot take it loses nothing but time: the next tick decides as it would have."""
    now = time.monotonic()
    with _sent_lock:
        if now - _sent.get(queue, -WAKE_EVERY) < WAKE_EVERY:
            return False
        _sent[queue] = now
    try:
        wake.apply_async(args=[queue], expires=60, retry=False)
    except Exception:  # noqa: BLE001 - a submit never fails for want of a wake
        log.warning("could not wake the controller for queue %r", queue, exc_info=True)
        return False
    return True


@shared_task(name="fleet.reap", ignore_result=True)
def reap() -> dict:
    return daemons.reap()


@worker_shutdown.connect
def stop_local_daemons(**kwargs) -> None:
    """The worker stops after the daemons it started have deregistered (fleet/drivers.py,
    LocalDriver.stop_all), while the web server still answers them."""
    DRIVERS[Provider.Kind.LOCAL].stop_all(timeout=LOCAL_DAEMONS_STOP_SECONDS)
