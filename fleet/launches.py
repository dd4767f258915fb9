"""A launch the provider could not carry out: the queue counts the failure and backs
off (its next launches wait), and the daemons recorded for it end. The controller
calls these within its tick; the drivers after the tick committed (sbatch refused, a
process that would not start) or while they reconcile with the provider."""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from fleet import daemons
from queues.elasticity import backoff_seconds
from queues.models import EventAction, Queue, QueueEvent
from queues.services import queue_event_now


def launch_failed(queue: Queue, *, count: int, error: str, now) -> str:
    """A launch of `count` failed with the provider's `error`: count the failure and
    back off (the queue launches nothing until then). Returns the event's reason."""
    failures = (
        Queue.objects.filter(pk=queue.pk).values_list("launch_failures", flat=True).first() or 0
    ) + 1
    wait = backoff_seconds(failures)
    Queue.objects.filter(pk=queue.pk).update(
        launch_failures=failures, launch_backoff_until=now + timedelta(seconds=wait)
    )
    provider = queue.provider.name if queue.provider_id else "no provider"
    return f"launch of {count} failed ({provider}: {error}); backing off {wait:.0f} s"


def launch_failed_event(queue: Queue, *, count: int, error: str, now) -> QueueEvent:
    """launch_failed, found outside the tick's own decision (after its commit, or while
    reconciling): a `launch_failed` event of its own, with the queue's signals now."""
    reason = launch_failed(queue, count=count, error=error, now=now)
    return queue_event_now(
        queue, action=EventAction.LAUNCH_FAILED, reason=reason, delta=-count, now=now
    )


def launch_failed_after_commit(*, queue_id: int, daemon_ids: list[int], error: str) -> None:
    """After a tick committed, the provider could not start daemons it recorded (sbatch
    refused, the process would not start): end their rows and tokens, then record the
    failed launch and back off, in one transaction."""
    with transaction.atomic():
        daemons.daemons_gone(daemon_ids=daemon_ids, reason="launch failed")
        queue = Queue.objects.select_related("provider").filter(pk=queue_id).first()
        if queue is not None:
            launch_failed_event(queue, count=len(daemon_ids), error=error, now=timezone.now())
