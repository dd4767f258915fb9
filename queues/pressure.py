"""The controller's signals (queues/services.queue_signals) for many queues at once, in
three statements whatever their number: live daemons by queue and state, queued
invocations (capped), running invocations (capped). The controller's tick
(fleet/controller.py) reads every queue's this way; queue_signals then answers
each of those queues from what was read, with no statement of its own."""

from queues import samples, services
from queues.models import Queue


def read(queues: list[Queue]) -> None:
    """Read the signals of `queues` now, and keep each queue's on it (`signals_read`)."""
    if not queues:
        return
    names = [queue.name for queue in queues]
    live = samples.live_daemons(names)
    running = samples.running_counts(names)
    pending = dict(
        Queue.objects.filter(name__in=names)
        .order_by()
        .annotate(capped=samples.capped_queued())
        .values_list("name", "capped")
    )
    for queue in queues:
        queue.signals_read = services.signals_from(
            live.get(queue.name, {}),
            pending=pending.get(queue.name, 0),
            running=running.get(queue.name, 0),
        )
