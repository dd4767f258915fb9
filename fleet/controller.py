"""The elasticity controller. For each queue it manages: look at the signals (D, B, P,
U), work out the desired count with the queue's formula (queues/elasticity.py, `plan`),
then act — up fast (straight to desired, at most LAKESHORE_MAX_LAUNCH_PER_TICK
launches), down slowly (never below the highest count wanted in the last
LAKESHORE_SCALE_DOWN_WINDOW seconds, idle daemons only, a few a tick) — and write an
event saying why. What a decision does to the daemons: fleet/scaling.py.

One path decides, whoever asks: `decide(queues)`. The beat's `tick` hands it every
managed queue, then samples the queues for the charts, prunes old no-op events and
observes the providers; a submit's `wake` hands it the one queue the submit went to.
Each queue's transaction-scoped advisory lock is held while it is decided for, so two
beats (or a beat and a wake) never act on the same queue at once; the database, not
the broker, records what was done.

Which queues it looks after. `managed`: the queues a tick decides for: those with an
elasticity declaration that are not archived (with a provider or not: one without says
why it does not grow), and an archived one while its provider still runs daemons for it
(it scales them to zero). Of those, the controller starts daemons for the queues with a
provider that are not archived (Queue.objects.starting_daemons, the rule a submit reads
too): a submit into one that no live daemon serves wakes the controller.

A decision costs what changed rather than how many queues it covers:

1. Leave out the queues backing off after failed ticks. Ask each provider what it runs
   (Driver.observe_queues: one `squeue` for all of a Slurm provider's queues), outside
   any transaction.
2. In one transaction: take the queues' locks in one statement (a queue another tick
   holds is skipped); bring the records up to date, once per provider
   (Driver.sync_queues); read every queue's signals (queues/pressure.py), its
   scale-down window (elasticity.window_peaks) and its latest event, a statement each.
3. Decide in memory with `plan`. Only a queue that launches or terminates runs
   statements of its own (in a savepoint: its failure undoes its part alone); its
   provider's outside work runs after the commit.
4. Write the events in one INSERT. A queue whose decision is a no-op or a hold
   identical to its latest event (same signals, same wanted and desired, same
   reason) writes none: an event says what changed. Reset the failure count of queues
   that tick again.

Then, each in a transaction of its own: a `tick_failed` event for each queue whose part
raised, and a wake for each queue a submit woke while this decision held it
(_missed_wakes)."""

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import connection, transaction
from django.db.models import CharField, Exists, Func, OuterRef, Q, QuerySet
from django.utils import timezone

from fleet import scaling, services
from fleet.driver_base import driver_for
from fleet.models import Daemon
from jobs.models import Invocation, InvocationState
from lakeshore_admin import hooks
from lakeshore_admin.names import NAME_MAX_LENGTH
from queues import elasticity, pressure, samples
from queues import services as queue_services
from queues.elasticity import backoff_seconds, plan, window_peaks
from queues.models import EventAction, Queue, QueueEvent, QueueState

logger = logging.getLogger("fleet.controller")  # the controller's one log

_QUIET = (EventAction.TICK_NOOP, EventAction.HOLD)  # what a tick writes only on a change
_COMPARED = ("action", "reason", "daemons", "busy", "pending", "desired", "wanted", "delta")
_LATEST_SQL = f"""
SELECT q.id, {", ".join(f"e.{name}" for name in _COMPARED)}
  FROM unnest(%s::bigint[]) AS q(id)
  CROSS JOIN LATERAL (SELECT * FROM queues_queueevent e WHERE e.queue_id = q.id
                       ORDER BY e.at DESC, e.id DESC LIMIT 1) AS e
"""  # noqa: S608 - column names of our own


_NAME_ARRAY = Func(
    OuterRef("name"),
    function="ARRAY",
    template="ARRAY[%(expressions)s]::varchar(63)[]",
    output_field=ArrayField(CharField(max_length=NAME_MAX_LENGTH)),
)


def managed() -> QuerySet[Queue]:
    running_daemons = (
        Daemon.objects.live()
        .filter(provider__isnull=False, queues__contains=_NAME_ARRAY)
        .order_by()
    )
    declared = ~Q(elasticity_kind="") & ~Q(state=QueueState.ARCHIVED)
    winding_down = Q(state=QueueState.ARCHIVED) & Exists(running_daemons)
    return Queue.objects.filter(declared | winding_down)


# A queue's lock: a transaction-scoped advisory lock on hashtext('tick:<queue id>'),
# taken without waiting, by the decision for the queue, so that two beats (or a beat
# and a wake) never act on the same queue at once.
_TRY_LOCK_SQL = (
    "SELECT q.id FROM unnest(%s::bigint[]) AS q(id)"
    " WHERE pg_try_advisory_xact_lock(hashtext('tick:' || q.id::text))"
)


def try_lock(queue_ids: list[int]) -> set[int]:
    """The locks of all these queues in one statement: the ids whose lock this
    transaction now holds (another tick holds the others)."""
    if not queue_ids:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(_TRY_LOCK_SQL, [sorted(queue_ids)])
        return {row[0] for row in cursor.fetchall()}


WOKEN = "woken by a submit"


def wake(queue_name: str, *, now=None) -> QueueEvent | None:
    """A submit into a queue that no live daemon serves, and whose provider starts them,
    asks for a decision now rather than at the next tick (fleet/tasks.py sends it after
    the submit commits). It is the beat's decision, for that one queue and under the
    same lock: a wake and a tick that race decide once, and the one that comes second
    sees the daemons the first started. None when nothing is to be done: the queue is
    gone, not one whose daemons the controller starts, backing off after failed ticks,
    served by now, or another tick holds it."""
    now = now or timezone.now()
    starts = Queue.objects.starting_daemons().filter(name=queue_name)
    queue = starts.select_related("provider").first()
    if queue is None:
        return None
    if Daemon.objects.live().subscribed_to(queue_name).exists():
        return None  # another wake or tick started one meanwhile
    return decide([queue], now=now, cause=WOKEN).of(queue.pk)


# The beat's tick is skipped when another ran less than this share of an interval ago:
# with two servers' beats firing out of step, the controller still runs once an interval.
BEAT_SHARE = 0.9

_BEAT_SQL = """
INSERT INTO fleet_beat AS b (name, at) VALUES (%(name)s, %(now)s)
ON CONFLICT (name) DO UPDATE SET at = EXCLUDED.at
 WHERE b.at <= EXCLUDED.at - make_interval(secs => %(gap)s)
RETURNING 1
"""


def beat_due(name: str = "tick", *, now=None) -> bool:
    """Whether a beat's `name` job should run now, noting that it does: False when any
    server's beat ran it less than BEAT_SHARE of LAKESHORE_TICK_SECONDS ago. One
    statement, so two beats at once never both run it."""
    params = {
        "name": name,
        "now": now or timezone.now(),
        "gap": settings.LAKESHORE_TICK_SECONDS * BEAT_SHARE,
    }
    with connection.cursor() as cursor:
        cursor.execute(_BEAT_SQL, params)
        return cursor.fetchone() is not None


def tick(*, now=None) -> dict:
    """The beat's tick: a decision for every queue the controller manages; then the
    charts' samples (queues/samples.py), the pruning of old `tick_noop` rows (never a
    queue's latest event: it says what is in force), and each provider observed
    (fleet/services.providers_observe: what `providers show` reads), after the
    decisions, so a slow provider delays no queue's. `queues` counts the queues decided
    for (a failure included); `skipped`, those another tick held or that are backing off."""
    now = now or timezone.now()
    decided = decide(list(managed().select_related("provider").order_by("pk")), now=now)
    try:  # the time series of the console's charts: every queue, once a minute
        with transaction.atomic():  # a failure here spoils nothing after it
            samples.record(now=now, events=list(decided.events.values()))
    except Exception:  # noqa: BLE001 - a chart's missing minute must not stop the tick
        logger.exception("controller tick: sampling the queues failed")
    return {
        "queues": len(decided.events) + len(decided.failed),
        "skipped": decided.skipped,
        "pruned": _prune(now),
        "providers": services.providers_observe(now=now),
    }


@dataclass
class Decided:
    """What a decision did: each queue's event (saved, unless it says what the queue's
    latest event says already), the `tick_failed` event of each queue whose part raised
    (None when it could not be written), and how many queues it skipped (another tick
    held them, or they are backing off)."""

    events: dict[int, QueueEvent] = field(default_factory=dict)
    failed: dict[int, QueueEvent | None] = field(default_factory=dict)
    skipped: int = 0

    def of(self, queue_id: int) -> QueueEvent | None:
        """The queue's event, whichever it was; None when it was skipped."""
        return self.events.get(queue_id) or self.failed.get(queue_id)


def decide(queues: list[Queue], *, now, cause: str = "") -> Decided:
    """The controller's decision for these queues (their providers loaded), carried out
    (see the module's steps). `cause` starts each event's reason when something other
    than the beat asked."""
    due = [q for q in queues if not (q.tick_failures and _backing_off(q, now))]
    decided = Decided(skipped=len(queues) - len(due))
    errors: dict[int, Exception] = {}
    observed = _observe(due, errors)
    events: list[QueueEvent] = []
    with transaction.atomic():
        owned = try_lock([q.pk for q in due if q.pk not in errors])
        fresh = list(Queue.objects.select_related("provider").filter(pk__in=owned))
        decided.skipped += len(due) - len(errors) - len(fresh)  # held by another, or removed
        _sync(fresh, {q.pk: q for q in due}, observed, now, errors)
        ready = [q for q in fresh if q.pk not in errors]
        if any(observed.get(q.pk) is not None for q in ready):
            _refresh_launch_fields(ready)  # a sync may have counted a failed launch
        pressure.read(ready)
        peaks = window_peaks([q.pk for q in ready], now=now)
        latest = _latest_events(ready)
        for queue in sorted(ready, key=lambda q: q.pk):
            event = _decide(queue, now, peaks, errors, cause)
            if event is not None:
                events.append(event)
        if ready:  # a point for the tests: it acted, and has not committed yet
            hooks.point("tick.acted")
        queue_services.queue_events_save(
            [e for e in events if not _unchanged(e, latest.get(e.queue_id))]
        )
        recovered = [q.pk for q in ready if q.tick_failures and q.pk not in errors]
        if recovered:
            Queue.objects.filter(pk__in=recovered, tick_failures__gt=0).update(
                tick_failures=0, tick_backoff_until=None
            )
    decided.events = {event.queue_id: event for event in events}
    for queue_id, error in sorted(errors.items()):
        decided.failed[queue_id] = _record_failure(queue_id, error, now)
    for name in _missed_wakes(events):
        wake(name)
    return decided


def _record_failure(queue_id: int, error: Exception, now) -> QueueEvent | None:
    """A queue's part raised. In a transaction of its own (the decision's was rolled
    back, or the queue's part of it): count the failure, back off like a failed launch,
    and write a `tick_failed` event with the reason and whatever signals can still be
    read (zeros if none). If even that fails (the database itself, say), logged, and
    the tick goes on."""
    try:
        with transaction.atomic():
            if not try_lock([queue_id]):
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


def _decide(queue: Queue, now, peaks: dict, errors: dict, cause: str) -> QueueEvent | None:
    """The queue's decision, carried out, and its event (not yet saved). A no-op or a
    hold runs no statement; a launch or termination runs in a savepoint."""
    driver = driver_for(queue.provider) if queue.provider else None
    try:
        seen = queue_services.queue_signals(queue)["signals"]
        decided = plan(queue, seen, now=now, peaks=peaks)
        if decided.action in ("launch", "terminate"):
            with transaction.atomic():
                action, delta, reason = scaling.act(queue, driver, decided, now)
        else:
            action, delta, reason = scaling.act(queue, driver, decided, now)
        return queue_services.queue_event(
            queue,
            action=action,
            reason=f"{cause}: {reason}" if cause else reason,
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
    """The queues a submit may have woken while this decision held them: the wake found
    the queue's lock held and did nothing, and the decision had read its signals before
    the submit committed. They are the queues it saw with no daemon and nothing queued,
    and that now hold queued work: one statement, and only when there are such queues.
    The controller then wakes them itself, as the submit asked (a wake's decision sees
    the queued work, so it does not wake the queue again)."""
    empty = [e.queue_id for e in events if e.daemons == 0 and e.pending == 0]
    if not empty:
        return []
    queued = Invocation.objects.filter(queue=OuterRef("name"), state=InvocationState.QUEUED)
    return list(
        Queue.objects.starting_daemons()
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
