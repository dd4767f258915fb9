"""Rows for the retention tests, at either side of the cutoff: NOW, OLD (just past
LAKESHORE_RETENTION_DAYS before it) and YOUNG (just inside), finished invocations and
queue events made in bulk, their ids, and the DELETE statements a sweep ran."""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from jobs.models import Invocation, InvocationState
from queues.models import EventAction, QueueEvent
from tests.support import builders

NOW = timezone.now()
OLD = NOW - timedelta(days=settings.LAKESHORE_RETENTION_DAYS, seconds=1)
YOUNG = NOW - timedelta(days=settings.LAKESHORE_RETENTION_DAYS) + timedelta(minutes=1)


def _invocations(n, state=InvocationState.SUCCEEDED, finished_at=OLD, **fields):
    return Invocation.objects.bulk_create(
        [
            Invocation(function="x.y", state=state, finished_at=finished_at, **fields)
            for _ in range(n)
        ]
    )


def _events(n, at=OLD, queue=None):
    queue = queue or builders.queue()
    return QueueEvent.objects.bulk_create(
        [
            QueueEvent(
                queue=queue,
                at=at,
                action=EventAction.SCALE_UP,
                reason="r",
                daemons=0,
                busy=0,
                pending=0,
                utilization=0.0,
                desired=1,
            )
            for _ in range(n)
        ]
    )


def _ids(rows):
    return {row.pk for row in rows}


def _deletes(ctx) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if "DELETE" in q["sql"]]
