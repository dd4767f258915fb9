"""Celery adapters: take nothing or ids, call a service. Safe to run twice at once."""

from celery import shared_task

from jobs import services


@shared_task(name="jobs.reap", ignore_result=True)
def reap() -> dict:
    return services.reap()
