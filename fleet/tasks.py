"""Celery adapters over the controller. Safe to run twice at once (advisory locks)."""

from celery import shared_task

from fleet import controller


@shared_task(name="fleet.tick", ignore_result=True)
def tick() -> dict:
    return controller.tick()
