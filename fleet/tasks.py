"""Celery adapters: the controller's tick and the reaper. Safe to run twice at once
(advisory locks, conditional changes)."""

from celery import shared_task

from fleet import controller, daemons


@shared_task(name="fleet.tick", ignore_result=True)
def tick() -> dict:
    return controller.tick()


@shared_task(name="fleet.wake", ignore_result=True)
def wake(queue_name: str) -> None:
    """A submit found no live daemon for an elastic queue (jobs/serving.py)."""
    controller.wake(queue_name)


@shared_task(name="fleet.reap", ignore_result=True)
def reap() -> dict:
    return daemons.reap()
