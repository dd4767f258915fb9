"""The elasticity controller. Each tick, per queue: look at the signals (D, B, P, U),
work out the desired count with the queue's formula (queues/elasticity.py), then act —
up fast (straight to desired, at most LAKESHORE_MAX_LAUNCH_PER_TICK launches), down
slowly (never below the highest count wanted in the last LAKESHORE_SCALE_DOWN_WINDOW
seconds, idle daemons only, a few a tick) — and write one event saying why.

A tick of one queue holds a transaction-scoped advisory lock, so two beats (or a beat
and a retried message) never act on the same queue at once; the database, not the
broker, records what was done."""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from fleet import daemons
from fleet.driver_base import ProviderError, driver_for
from fleet.launches import launch_failed
from fleet.models import Daemon, DaemonState
from lakeshore_admin import hooks
from queues import elasticity, samples
from queues import services as queue_services
from queues.elasticity import Plan, backoff_seconds, plan
from queues.models import EventAction, Queue, QueueEvent, QueueState

logger = logging.getLogger(__name__)


def _try_lock(queue_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s))", [f"tick:{queue_id}"])
        return bool(cursor.fetchone()[0])


def tick_queue(queue_id: int, *, now=None, cause: str = "") -> QueueEvent | None:
    """One controller decision for one queue. None when another tick holds the queue.
    `cause` starts the event's reason when something other than the beat asked."""

    now = now or timezone.now()
    # What the provider runs is asked before the transaction: a slow shell-out or HTTP
    # call must not hold the queue's lock and rows (a failure is this tick's failure).
    before = Queue.objects.select_related("provider").filter(pk=queue_id).first()
    observed = None
    if before is not None and before.provider is not None:
        observed = driver_for(before.provider).observe(provider=before.provider, queue=before)
    with transaction.atomic():
        if not _try_lock(queue_id):
            return None
        queue = Queue.objects.select_related("provider").filter(pk=queue_id).first()
        if queue is None:
            return None
        driver = driver_for(queue.provider) if queue.provider else None
        if driver:
            if before is None or before.provider_id != queue.provider_id:
                observed = None  # the queue changed provider meanwhile: judge nothing
            driver.sync(provider=queue.provider, queue=queue, now=now, observed=observed)
            if observed is not None:  # sync may have counted a failed launch
                queue.refresh_from_db(fields=["launch_failures", "launch_backoff_until"])
        signals = queue_services.queue_signals(queue)["signals"]
        decided = plan(queue, signals, now=now)
        action, delta, reason = EventAction.TICK_NOOP, 0, decided.why
        if decided.action == "hold":
            action = EventAction.HOLD
        elif decided.action == "launch":
            action, delta, reason = _launch(queue, driver, decided, now)
        elif decided.action == "terminate":
            action, delta, reason = _terminate(queue, driver, decided, now)
        hooks.point("tick.acted")
        return queue_services.queue_event_now(
            queue,
            action=action,
            reason=f"{cause}: {reason}" if cause else reason,
            delta=delta,
            now=now,
            signals=signals,
            desired=decided.desired,
            wanted=decided.wanted,
        )


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


WOKEN = "woken by a submit"


def wake(queue_name: str, *, now=None) -> QueueEvent | None:
    """A submit into a queue that no live daemon serves, and whose provider starts them,
    asks for a decision now rather than at the next tick (jobs/serving.py sends it after
    the submit commits). The decision is an ordinary tick of that queue, under the same
    lock: a wake and a tick that race decide once, and the one that comes second sees
    the daemons the first started. None when nothing is to be done: the queue is gone,
    not the controller's, backing off after failed ticks, served by now, or another
    tick holds it."""
    now = now or timezone.now()
    queue = (
        Queue.objects.exclude(elasticity_kind="")
        .exclude(state=QueueState.ARCHIVED)
        .filter(name=queue_name, provider__isnull=False)
        .only("pk", "tick_backoff_until")
        .first()
    )
    if queue is None or (queue.tick_backoff_until and queue.tick_backoff_until > now):
        return None
    if Daemon.objects.live().subscribed_to(queue_name).exists():
        return None  # another wake or tick started one meanwhile
    return tick_queue(queue.pk, now=now, cause=WOKEN)


def tick(*, now=None) -> dict:
    """A tick over every queue the controller manages; prunes old tick_noop rows.

    Each queue's tick is isolated: one that raises is rolled back, becomes a
    `tick_failed` event and backs off (the queue is skipped, without an event, until
    `tick_backoff_until`), and every other queue still ticks. A queue whose tick
    succeeds again has its failure count reset. `queues` counts the queues that got an
    event (tick_failed included); `skipped`, those locked by another tick or backing off."""
    now = now or timezone.now()
    managed = set(
        Queue.objects.exclude(elasticity_kind="")
        .exclude(state=QueueState.ARCHIVED)
        .values_list("pk", flat=True)
    )
    # An archived queue needs ticks only while its provider still runs daemons for it.
    still_running = {
        name
        for names in Daemon.objects.live()
        .filter(provider__isnull=False)
        .values_list("queues", flat=True)
        for name in names
    }
    managed |= set(
        Queue.objects.filter(state=QueueState.ARCHIVED, name__in=still_running).values_list(
            "pk", flat=True
        )
    )
    failing = dict(
        Queue.objects.filter(pk__in=managed, tick_failures__gt=0).values_list(
            "pk", "tick_backoff_until"
        )
    )
    decided = skipped = 0
    events = []
    for queue_id in sorted(managed):
        until = failing.get(queue_id)
        if until is not None and until > now:
            skipped += 1  # backing off after a failed tick: no event, no noise
            continue
        try:
            event = tick_queue(queue_id, now=now)
        except Exception as exc:  # noqa: BLE001 - one queue must not stop the others
            logger.exception("controller tick of queue %s failed", queue_id)
            _tick_failed(queue_id, exc, now)
            decided += 1
            continue
        if event is None:
            skipped += 1
            continue
        decided += 1
        events.append(event)
        if queue_id in failing:
            Queue.objects.filter(pk=queue_id, tick_failures__gt=0).update(
                tick_failures=0, tick_backoff_until=None
            )
    try:  # the time series of the console's charts: every queue, once a minute
        with transaction.atomic():  # a failure here spoils nothing after it
            samples.record(now=now, events=events)
    except Exception:  # noqa: BLE001 - a chart's missing minute must not stop the tick
        logger.exception("controller tick: sampling the queues failed")
    retention = timedelta(seconds=settings.LAKESHORE_NOOP_RETENTION)
    pruned, _ = QueueEvent.objects.filter(
        action=EventAction.TICK_NOOP, at__lt=now - retention
    ).delete()
    return {"queues": decided, "skipped": skipped, "pruned": pruned}


def _tick_failed(queue_id: int, error: Exception, now) -> QueueEvent | None:
    """In a transaction of its own (the tick's was rolled back): count the failure,
    back off like a failed launch, and write a `tick_failed` event with the reason and
    whatever signals can still be read (zeros if none)."""

    try:
        with transaction.atomic():
            if not _try_lock(queue_id):
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
    except Exception:  # noqa: BLE001 - e.g. the database itself is failing: go on
        logger.exception("could not record the failed tick of queue %s", queue_id)
        return None
