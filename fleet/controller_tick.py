"""The controller's tick over every queue it manages, at a cost that follows what
changed rather than how many queues there are.

1. Read the managed queues (fleet/controller_queues.py), leaving out those backing off
   after failed ticks. Ask each provider what it runs (Driver.observe_queues: one
   `squeue` for all of a Slurm provider's queues), outside any transaction.
2. In one transaction: take the queues' locks in one statement (a queue another tick
   holds is skipped); bring the records up to date, once per provider
   (Driver.sync_queues); read every queue's signals (queues/pressure.py), its
   scale-down window (elasticity.window_peaks) and its latest event, a statement each.
3. Decide in memory with `plan`, as a tick of one queue does. Only a queue that
   launches or terminates runs statements of its own (in a savepoint: its failure
   undoes its part alone); its provider's outside work runs after the commit.
4. Write the events in one INSERT. A queue whose decision is a no-op or a hold
   identical to its latest event (same signals, same wanted and desired, same
   reason) writes none: an event says what changed. Reset the failure count of queues
   that tick again.

Then, each in a transaction of its own: a `tick_failed` event for each queue whose part
raised, a wake for each queue a submit woke while this tick held it (_missed_wakes), the
charts' samples (queues/samples.py) and the pruning of old `tick_noop` rows (never a
queue's latest event: it says what is in force)."""

import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q

from fleet import controller_acts
from fleet.controller_queues import managed, starting
from fleet.driver_base import driver_for
from jobs.models import Invocation, InvocationState
from lakeshore_admin import hooks
from queues import pressure, samples
from queues import services as queue_services
from queues.elasticity import plan, window_peaks
from queues.models import EventAction, Queue, QueueEvent

logger = logging.getLogger("fleet.controller")  # the controller's one log

_QUIET = (EventAction.TICK_NOOP, EventAction.HOLD)  # what a tick writes only on a change
_COMPARED = ("action", "reason", "daemons", "busy", "pending", "desired", "wanted", "delta")
_LATEST_SQL = f"""
SELECT q.id, {", ".join(f"e.{name}" for name in _COMPARED)}
  FROM unnest(%s::bigint[]) AS q(id)
  CROSS JOIN LATERAL (SELECT * FROM queues_queueevent e WHERE e.queue_id = q.id
                       ORDER BY e.at DESC, e.id DESC LIMIT 1) AS e
"""  # noqa: S608 - column names of our own


def tick(
    *, now, failed: Callable[[int, Exception, object], object], wake: Callable[[str], object]
) -> dict:
    """`failed(queue_id, error, now)` records a queue whose part raised (after the
    commit); `wake(queue_name)` is the controller's wake (see _missed_wakes). `queues`
    counts the queues decided for (a failure included); `skipped`, those another tick
    held or that are backing off."""
    queues = list(managed().select_related("provider").order_by("pk"))
    due = [q for q in queues if not (q.tick_failures and _backing_off(q, now))]
    skipped = len(queues) - len(due)
    errors: dict[int, Exception] = {}
    observed = _observe(due, errors)
    events: list[QueueEvent] = []
    with transaction.atomic():
        owned = controller_acts.try_lock_many([q.pk for q in due if q.pk not in errors])
        fresh = list(Queue.objects.select_related("provider").filter(pk__in=owned))
        skipped += len(due) - len(errors) - len(fresh)  # held by another, or removed
        _sync(fresh, {q.pk: q for q in due}, observed, now, errors)
        ready = [q for q in fresh if q.pk not in errors]
        if any(observed.get(q.pk) is not None for q in ready):
            _refresh_launch_fields(ready)  # a sync may have counted a failed launch
        pressure.read(ready)
        peaks = window_peaks([q.pk for q in ready], now=now)
        latest = _latest_events(ready)
        for queue in sorted(ready, key=lambda q: q.pk):
            event = _decide(queue, now, peaks, errors)
            if event is not None:
                events.append(event)
        hooks.point("tick.acted")
        queue_services.queue_events_save(
            [e for e in events if not _unchanged(e, latest.get(e.queue_id))]
        )
        recovered = [q.pk for q in ready if q.tick_failures and q.pk not in errors]
        if recovered:
            Queue.objects.filter(pk__in=recovered, tick_failures__gt=0).update(
                tick_failures=0, tick_backoff_until=None
            )
    for queue_id, error in sorted(errors.items()):
        failed(queue_id, error, now)
    for name in _missed_wakes(events):
        wake(name)
    try:  # the time series of the console's charts: every queue, once a minute
        with transaction.atomic():  # a failure here spoils nothing after it
            samples.record(now=now, events=events)
    except Exception:  # noqa: BLE001 - a chart's missing minute must not stop the tick
        logger.exception("controller tick: sampling the queues failed")
    return {"queues": len(events) + len(errors), "skipped": skipped, "pruned": _prune(now)}


def _backing_off(queue: Queue, now) -> bool:
    return queue.tick_backoff_until is not None and queue.tick_backoff_until > now


def _by_provider(queues: list[Queue]) -> dict:
    groups = defaultdict(list)
    for queue in queues:
        if queue.provider is not None:
            groups[queue.provider_id].append(queue)
    return groups


def _group_failed(queues: list[Queue], errors: dict, exc: Exception, what: str) -> None:
    """Inside the `except`: each of these queues' tick fails with `exc` (logged once)."""
    logger.exception(
        "controller tick of queue(s) %s failed (%s)", ", ".join(str(q.pk) for q in queues), what
    )
    for queue in queues:
        errors[queue.pk] = exc


def _observe(queues: list[Queue], errors: dict) -> dict:
    """Before the transaction: what each provider runs (a slow shell-out or HTTP call
    must not hold the queues' locks and rows). A failure is its queues' tick's failure."""
    observed: dict = {}
    for group in _by_provider(queues).values():
        provider = group[0].provider
        try:
            observed.update(driver_for(provider).observe_queues(provider=provider, queues=group))
        except Exception as exc:  # noqa: BLE001 - those queues' failure, not the tick's
            _group_failed(group, errors, exc, "observing its provider")
    return observed


def _sync(fresh: list[Queue], before: dict, observed: dict, now, errors: dict) -> None:
    """Once per provider, in a savepoint: a provider whose records cannot be brought
    up to date fails its queues' ticks alone."""
    for group in _by_provider(fresh).values():
        provider = group[0].provider
        seen = {  # a queue that changed provider since it was observed: judge nothing
            q.pk: observed.get(q.pk)
            for q in group
            if q.pk in before and before[q.pk].provider_id == q.provider_id
        }
        try:
            with transaction.atomic():
                driver_for(provider).sync_queues(
                    provider=provider, queues=group, now=now, observed=seen
                )
        except Exception as exc:  # noqa: BLE001 - those queues' failure, not the tick's
            _group_failed(group, errors, exc, "bringing its provider's records up to date")


def _refresh_launch_fields(queues: list[Queue]) -> None:
    rows = Queue.objects.filter(pk__in=[q.pk for q in queues]).values_list(
        "pk", "launch_failures", "launch_backoff_until"
    )
    now_known = {pk: (failures, until) for pk, failures, until in rows}
    for queue in queues:
        if queue.pk in now_known:
            queue.launch_failures, queue.launch_backoff_until = now_known[queue.pk]


def _latest_events(queues: list[Queue]) -> dict[int, dict]:
    if not queues:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(_LATEST_SQL, [[q.pk for q in queues]])
        return {row[0]: dict(zip(_COMPARED, row[1:], strict=True)) for row in cursor.fetchall()}


def _decide(queue: Queue, now, peaks: dict, errors: dict) -> QueueEvent | None:
    """The queue's decision, carried out, and its event (not yet saved). A no-op or a
    hold runs no statement; a launch or termination runs in a savepoint."""
    driver = driver_for(queue.provider) if queue.provider else None
    try:
        seen = queue_services.queue_signals(queue)["signals"]
        decided = plan(queue, seen, now=now, peaks=peaks)
        if decided.action in ("launch", "terminate"):
            with transaction.atomic():
                action, delta, reason = controller_acts.act(queue, driver, decided, now)
        else:
            action, delta, reason = controller_acts.act(queue, driver, decided, now)
        return queue_services.queue_event(
            queue,
            action=action,
            reason=reason,
            delta=delta,
            now=now,
            signals=seen,
            desired=decided.desired,
            wanted=decided.wanted,
        )
    except Exception as exc:  # noqa: BLE001 - one queue must not stop the others
        logger.exception("controller tick of queue %s failed", queue.pk)
        errors[queue.pk] = exc
        return None


def _missed_wakes(events: list[QueueEvent]) -> list[str]:
    """The queues a submit may have woken while this tick held them: the wake found the
    queue's lock held and did nothing, and the tick had read its signals before the
    submit committed. They are the queues the tick saw with no daemon and nothing
    queued, and that now hold queued work: one statement, and only when there are such
    queues. The tick then wakes them itself, as the submit asked."""
    empty = [e.queue_id for e in events if e.daemons == 0 and e.pending == 0]
    if not empty:
        return []
    queued = Invocation.objects.filter(queue=OuterRef("name"), state=InvocationState.QUEUED)
    return list(
        starting()
        .filter(pk__in=empty)
        .filter(Exists(queued.order_by()))
        .order_by("pk")
        .values_list("name", flat=True)
    )


def _unchanged(event: QueueEvent, latest: dict | None) -> bool:
    """A quiet decision that says what the queue's latest event says already."""
    return (
        latest is not None
        and event.action in _QUIET
        and all(getattr(event, name) == latest[name] for name in _COMPARED)
    )


def _prune(now) -> int:
    """Old tick_noop rows, but never a queue's latest event."""
    newer = QueueEvent.objects.filter(queue=OuterRef("queue")).filter(
        Q(at__gt=OuterRef("at")) | Q(at=OuterRef("at"), id__gt=OuterRef("id"))
    )
    retention = timedelta(seconds=settings.LAKESHORE_NOOP_RETENTION)
    pruned, _ = (
        QueueEvent.objects.filter(action=EventAction.TICK_NOOP, at__lt=now - retention)
        .filter(Exists(newer))
        .delete()
    )
    return pruned
