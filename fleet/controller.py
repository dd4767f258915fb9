"""The elasticity controller. For each queue it manages: look at the signals (D, B, P,
U), work out the desired count with the queue's formula (queues/elasticity.py, `plan`),
then act — up fast (straight to desired, at most LAKESHORE_MAX_LAUNCH_PER_TICK
launches), down slowly (never below the highest count wanted in the last
LAKESHORE_SCALE_DOWN_WINDOW seconds, idle daemons only, a few a tick) — and write an
event saying why.

Two doors: `tick` decides for every managed queue at once, in a fixed number of
statements (fleet/controller_tick.py); `tick_queue` decides for one (a wake after a
submit, and the tests). Either holds each queue's transaction-scoped advisory lock
while it decides and acts, so two beats (or a beat and a wake) never act on the same
queue at once; the database, not the broker, records what was done. What the decision
does: fleet/controller_acts.py."""

import logging

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from fleet import controller_acts, controller_tick, services
from fleet.controller_queues import starting
from fleet.driver_base import driver_for
from fleet.models import Daemon
from lakeshore_admin import hooks
from queues import services as queue_services
from queues.elasticity import plan
from queues.models import Queue, QueueEvent

logger = logging.getLogger(__name__)


def _try_lock(queue_id: int) -> bool:
    return controller_acts.try_lock(queue_id)


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
        action, delta, reason = controller_acts.act(queue, driver, decided, now)
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


WOKEN = "woken by a submit"


def wake(queue_name: str, *, now=None) -> QueueEvent | None:
    """A submit into a queue that no live daemon serves, and whose provider starts them,
    asks for a decision now rather than at the next tick (jobs/serving.py sends it after
    the submit commits). The decision is an ordinary tick of that queue, under the same
    lock: a wake and a tick that race decide once, and the one that comes second sees
    the daemons the first started. None when nothing is to be done: the queue is gone,
    not one whose daemons the controller starts, backing off after failed ticks, served
    by now, or another tick holds it."""
    now = now or timezone.now()
    queue = starting().filter(name=queue_name).only("pk", "tick_backoff_until").first()
    if queue is None or (queue.tick_backoff_until and queue.tick_backoff_until > now):
        return None
    if Daemon.objects.live().subscribed_to(queue_name).exists():
        return None  # another wake or tick started one meanwhile
    return tick_queue(queue.pk, now=now, cause=WOKEN)


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
    """A tick over every queue the controller manages (fleet/controller_tick.py); then
    each provider is observed (fleet/services.providers_observe: what `providers show`
    reads), after the decisions, so a slow provider delays no queue's."""
    now = now or timezone.now()
    done = controller_tick.tick(now=now, failed=_tick_failed, wake=wake)
    return {**done, "providers": services.providers_observe(now=now)}


def _tick_failed(queue_id: int, error: Exception, now) -> QueueEvent | None:
    """A queue's tick raised: its tick_failed event and back-off, in a transaction of
    its own; if even that fails (the database itself, say), logged, and the tick goes on."""
    try:
        return controller_acts.tick_failed(queue_id, error, now, lock=_try_lock)
    except Exception:  # noqa: BLE001 - e.g. the database itself is failing: go on
        logger.exception("could not record the failed tick of queue %s", queue_id)
        return None
