"""What a controller decision does (fleet/controller.py): the launch or the termination
a plan asks for, carried out through the queue's provider."""

from datetime import timedelta

from django.conf import settings

from fleet import daemons
from fleet.driver_base import ProviderError
from fleet.launches import launch_failed
from fleet.models import Daemon, DaemonState
from lakeshore_admin import hooks
from queues.elasticity import Plan
from queues.models import EventAction, Queue


def act(queue: Queue, driver, decided: Plan, now) -> tuple[str, int, str]:
    """Carry out the plan: (the event's action, delta, reason)."""
    if decided.action == "hold":
        return EventAction.HOLD, 0, decided.why
    if decided.action == "launch":
        return _launch(queue, driver, decided, now)
    if decided.action == "terminate":
        return _terminate(queue, driver, decided, now)
    return EventAction.TICK_NOOP, 0, decided.why


def _launch(queue: Queue, driver, decided: Plan, now):
    try:
        launched = driver.launch(provider=queue.provider, queue=queue, count=decided.delta, now=now)
    except ProviderError as exc:
        reason = launch_failed(queue, count=decided.delta, error=str(exc), now=now)
        return EventAction.LAUNCH_FAILED, 0, reason
    Queue.objects.filter(pk=queue.pk).update(launch_failures=0, launch_backoff_until=None)
    return EventAction.SCALE_UP, len(launched), decided.why


def _terminate(queue: Queue, driver, decided: Plan, now):
    """Idle daemons only (never busy, provisioning, or inside the start-up grace), and
    only ones the queue's provider runs: self-registered daemons are left alone. Each
    is first moved idle → draining by a conditional update that fails if it claimed
    work meanwhile, then ended once it runs nothing; its process is stopped after the
    tick commits."""
    grace = timedelta(seconds=settings.LAKESHORE_STARTUP_GRACE)
    ours = (
        Daemon.objects.subscribed_to(queue.name).filter(provider_id=queue.provider_id)
        if queue.provider_id
        else Daemon.objects.none()
    )
    candidates = list(
        ours.filter(state=DaemonState.IDLE, created_at__lte=now - grace)
        .order_by("-created_at")
        .values_list("pk", flat=True)[: -decided.delta]
    )
    hooks.point("scale_down.chosen")
    retired = daemons.daemons_retire(daemon_ids=candidates) if driver is not None else []
    ended = daemons.daemons_end_drained(ours) if driver is not None else []
    if not ended:
        return (
            EventAction.TICK_NOOP,
            0,
            decided.why.split(" → ")[0] + f"; {-decided.delta} fewer wanted, but no idle "
            "daemon of its provider is past the start-up grace",
        )
    reason = decided.why.split(" → ")[0] + f" → terminated {len(ended)}"
    if len(retired) < len(candidates):
        reason += f" ({len(candidates) - len(retired)} took work meanwhile and stay)"
    return EventAction.SCALE_DOWN, -len(ended), reason
