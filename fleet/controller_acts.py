"""What a controller decision does, whichever tick makes it (one queue's, in
fleet/controller.py, or every queue's at once, in fleet/controller_tick.py): the queue
locks, the launch or termination a plan asks for, and a failed tick's record."""

from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction

from fleet import daemons
from fleet.driver_base import ProviderError
from fleet.launches import launch_failed
from fleet.models import Daemon, DaemonState
from lakeshore_admin import hooks
from queues import elasticity
from queues import services as queue_services
from queues.elasticity import Plan, backoff_seconds
from queues.models import EventAction, Queue, QueueEvent

# A queue's lock: a transaction-scoped advisory lock on hashtext('tick:<queue id>'),
# taken without waiting, by the tick deciding for the queue, so that two beats (or a
# beat and a wake) never act on the same queue at once. One queue's, or many at once.
_TRY_LOCK_SQL = "SELECT pg_try_advisory_xact_lock(hashtext('tick:' || %s::text))"
_TRY_LOCK_MANY_SQL = (
    "SELECT q.id FROM unnest(%s::bigint[]) AS q(id)"
    " WHERE pg_try_advisory_xact_lock(hashtext('tick:' || q.id::text))"
)


def try_lock(queue_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_TRY_LOCK_SQL, [queue_id])
        return bool(cursor.fetchone()[0])


def try_lock_many(queue_ids: list[int]) -> set[int]:
    """The locks of all these queues in one statement: the ids whose lock this
    transaction now holds (another tick holds the others)."""
    if not queue_ids:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(_TRY_LOCK_MANY_SQL, [sorted(queue_ids)])
        return {row[0] for row in cursor.fetchall()}


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


def tick_failed(queue_id: int, error: Exception, now, *, lock=try_lock) -> QueueEvent | None:
    """In a transaction of its own (the tick's was rolled back, or the queue's part of
    it): count the failure, back off like a failed launch, and write a `tick_failed`
    event with the reason and whatever signals can still be read (zeros if none)."""

    with transaction.atomic():
        if not lock(queue_id):
            return None  # another tick holds the queue: it will speak for it
        queue = Queue.objects.select_related("provider").filter(pk=queue_id).first()
        if queue is None:
            return None
        failures = queue.tick_failures + 1
        wait = backoff_seconds(failures)
        Queue.objects.filter(pk=queue_id).update(
            tick_failures=failures, tick_backoff_until=now + timedelta(seconds=wait)
        )
        try:
            with transaction.atomic():  # a savepoint: a failed read spoils nothing
                signals = queue_services.queue_signals(queue)["signals"]
        except Exception:  # noqa: BLE001 - the event is written with zeros instead
            signals = elasticity.Signals(daemons=0, busy=0, pending=0)
        suffix = f"; {failures} failed tick(s) in a row: skipping this queue for {wait:.0f} s"
        cause = f"tick failed: {type(error).__name__}: {error}"
        return queue_services.queue_event_now(
            queue,
            action=EventAction.TICK_FAILED,
            reason=cause[: 500 - len(suffix)] + suffix,
            delta=0,
            now=now,
            signals=signals,
        )
