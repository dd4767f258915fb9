"""A builder for controller decisions (QueueEvent rows), oldest first."""

from datetime import timedelta

from django.utils import timezone

from queues.models import QueueEvent


def event(queue, action: str = "scale_up", *, seconds_ago: float = 0, **fields) -> QueueEvent:
    values = {
        "reason": f"{action} for the test",
        "daemons": 2,
        "busy": 1,
        "pending": 3,
        "utilization": 0.5,
        "desired": 4,
        "delta": 2,
    }
    values.update(fields)
    at = timezone.now() - timedelta(seconds=seconds_ago)
    return QueueEvent.objects.create(queue=queue, action=action, at=at, **values)


def events(queue, actions: list[str], *, seconds_apart: float = 1) -> list[QueueEvent]:
    """One event per action, the first the oldest."""
    count = len(actions)
    return [
        event(queue, action, seconds_ago=(count - index) * seconds_apart)
        for index, action in enumerate(actions)
    ]
