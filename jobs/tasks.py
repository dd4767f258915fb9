"""Celery adapters: take nothing or ids, call a service. Safe to run twice at once."""

from celery import shared_task

from jobs import retention


@shared_task(name="jobs.retention", ignore_result=True)
def retention_sweep() -> dict:
    return retention.scheduled_sweep()
