"""The daemon lifecycle, in one place.

    (provider launch) provisioning ──register──▶ idle ⇄ busy ──retire──▶ draining
                                                   │                        │ runs nothing
                      lost ◀──reaper (silent)──────┤                        ▼
                        └──register again──▶ (new row)   deregister/drop ──▶ terminated

Heartbeats, busy/idle, drop, deregister, scale-down (retire, then end once it runs
nothing) and the reaper's lost all live here; registration and who may speak for a
daemon in fleet/registration.py. Changes to what a daemon runs go through
jobs.transitions. A daemon's credential is revoked in the same transaction that ends
it; asking the provider to stop it (a process, a Slurm job) happens only after that
transaction commits."""

from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from accounts import audit
from accounts.models import ApiToken
from fleet import parked
from fleet.driver_base import driver_for
from fleet.models import (
    CLAIMING_DAEMON_STATES,
    LIVE_DAEMON_STATES,
    Daemon,
    DaemonState,
)
from fleet.parked import write_every
from jobs.models import Invocation
from jobs.sdk import POLL_MAX_SECONDS
from jobs.transitions import claim, completion, kill, rescue
from jobs.transitions.states import RUNNING
from jobs.wakeup import CHANNEL as WORK_CHANNEL
from lakeshore_admin.errors import Conflict
from queues.models import EventAction, Queue
from queues.services import queue_event_now

# ---------------------------------------------------------------------------- liveness


def check_live(daemon: Daemon) -> Daemon:
    """A daemon that is not live gets a Conflict whose code says what to do:
    `daemon_terminated` (stop) or `daemon_lost` (register again)."""
    if daemon.state == DaemonState.TERMINATED:
        raise Conflict(
            f"Daemon {daemon.pk} is terminated (dropped or left): it takes no more work.",
            extra={"state": daemon.state},
            code="daemon_terminated",
        )
    if daemon.state == DaemonState.LOST:
        raise Conflict(
            f"Daemon {daemon.pk} is lost (silent past the heartbeat timeout; its work was "
            "handed back): register again to take work.",
            extra={"state": daemon.state},
            code="daemon_lost",
        )
    return daemon


def refresh_live(daemon: Daemon) -> Daemon:
    """check_live on the daemon's row as it is now. A row deleted meanwhile (`daemons
    rm`, while its claim waited) is a daemon that ended: daemon_terminated."""
    try:
        daemon.refresh_from_db(fields=["state", "queues"])
    except Daemon.DoesNotExist:
        raise Conflict(
            f"Daemon {daemon.pk} was removed: it takes no more work.",
            extra={"state": DaemonState.TERMINATED.value},
            code="daemon_terminated",
        ) from None
    return check_live(daemon)


# Busy/idle follow what the daemon runs, lazily, so that the daemon's row is not written
# on every call: a claim that takes work marks it busy in its own statement (when it is
# not busy already: jobs/transitions/claim.py), and it goes back to idle here (touch), at its
# next claim that finds nothing, at a completion when nothing is queued for it
# (completed), or at its next heartbeat, whichever comes first. So a daemon working
# through a backlog, completing and claiming again, writes its row at neither. At worst
# busy lasts a moment too long (until the daemon asks for more), never idle while it
# runs something (scale-down re-checks what it runs anyway: daemons_retire). The heartbeat
# time is rewritten only when it is older than LAKESHORE_HEARTBEAT_WRITE_SECONDS. The
# update re-checks the state it computed from: a drop or retire that commits meanwhile
# is never overwritten.
_TOUCH_SQL = """
WITH want AS (
    SELECT d.id, d.state AS seen,
           CASE WHEN d.state = ANY(%(working)s)
                THEN CASE WHEN EXISTS (SELECT 1 FROM jobs_invocation
                                        WHERE daemon_id = %(daemon)s AND state = %(running)s)
                          THEN %(busy)s ELSE %(idle)s END
                ELSE d.state END AS state
      FROM fleet_daemon d
     WHERE d.id = %(daemon)s AND d.state = ANY(%(live)s)
)
UPDATE fleet_daemon d
   SET state = want.state, last_heartbeat_at = now(), updated_at = now()
  FROM want
 WHERE d.id = want.id AND d.state = want.seen
   AND (d.last_heartbeat_at IS NULL
        OR d.last_heartbeat_at < now() - make_interval(secs => %(every)s)
        OR d.state <> want.state)
"""


def touch(daemon_id: int, *, locked: bool = False) -> None:
    """Heartbeat and busy/idle in one statement, which writes only when busy/idle
    changed or the heartbeat is getting old. It first takes the daemon's row lock, so
    that what it reads of the daemon's invocations includes any claim that committed
    while it waited: in one statement its snapshot would predate that claim, and it
    would write idle under work just taken. `locked`: the caller's transaction holds
    that lock already (a claim statement ran in it)."""
    if locked:
        with connection.cursor() as cursor:
            cursor.execute(_TOUCH_SQL, touch_params(daemon_id))
        return
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM fleet_daemon WHERE id = %s FOR NO KEY UPDATE", [daemon_id])
        cursor.execute(_TOUCH_SQL, touch_params(daemon_id))


def touch_params(daemon_id: int) -> dict:
    return {
        "daemon": daemon_id,
        "running": RUNNING,
        "working": [str(s) for s in CLAIMING_DAEMON_STATES],
        "live": [str(s) for s in LIVE_DAEMON_STATES],
        "busy": DaemonState.BUSY.value,
        "idle": DaemonState.IDLE.value,
        "every": write_every(),
    }


def current_invocation_id(daemon_id: int) -> int | None:
    """The newest invocation the daemon runs, by the rule Daemon.objects.for_list()
    annotates many daemons with."""
    return (
        Daemon.objects.for_list()
        .filter(pk=daemon_id)
        .values_list("current_invocation_id", flat=True)
        .first()
    )


def completed(daemon: Daemon, *, claim_follows: bool = False) -> None:
    """Busy/idle once outcomes are recorded (in a batch, in its transaction). With a
    claim to follow (an exchange), or while the daemon's queues hold work (its next
    claim comes at once: it has a free slot), that claim says busy or idle, and only a
    heartbeat that is due is renewed. Otherwise (the daemon long-polls an empty queue
    while this report goes on its own) it becomes idle now if it runs nothing more."""
    if claim_follows or daemon.state != DaemonState.BUSY or claim.any_queued(daemon.queues or [""]):
        if heartbeat_due(daemon):
            touch(daemon.pk)
        return
    touch(daemon.pk)


def idle_owed(daemon: Daemon, *, parking: bool = False) -> bool:
    """Whether a claim that took nothing should touch its daemon: it was busy (it goes
    back to idle unless it still runs something), or its heartbeat is due. `parking`:
    the claim is about to wait, and PARKED renews it from the next turn, so only a
    heartbeat as old as a turn is due."""
    if daemon.state == DaemonState.BUSY:
        return True
    return heartbeat_due(daemon, within=parked.renew_every() if parking else None)


def heartbeat_due(daemon: Daemon, *, within: float | None = None) -> bool:
    """Whether its heartbeat time is old enough that touch would rewrite it (`within`:
    older than that many seconds)."""
    seen = daemon.last_heartbeat_at
    every = write_every() if within is None else within
    return seen is None or (timezone.now() - seen).total_seconds() >= every


CLAIM_GRACE_SECONDS = 30  # a claim's answer reaches its daemon well within this
SDK_POLL_GRACE_SECONDS = 5  # between an SDK worker's polls, beyond their own length


def daemon_heartbeat(*, daemon: Daemon, held: list[int] | None = None, drain=False) -> dict:
    """The daemon is alive. The answer tells it what the server believes: its state
    (draining → stop claiming) and which invocations it should still be running.
    With `held` (what the daemon holds), work the server counts as running there but
    the daemon never got — a claim whose answer was lost — goes back to the queue once
    it is older than CLAIM_GRACE_SECONDS, its attempt given back. `drain`: the daemon is
    stopping; it becomes draining, which wakes its waiting claim (fleet/migrations/
    0002_notify_drain), so it stops without waiting out its long-poll."""

    check_live(daemon)
    if drain:
        Daemon.objects.filter(pk=daemon.pk, state__in=CLAIMING_DAEMON_STATES).update(
            state=DaemonState.DRAINING, updated_at=timezone.now()
        )
    if held is not None:
        rescue.release_unheld(daemon_id=daemon.pk, held=held, grace=CLAIM_GRACE_SECONDS)
    touch(daemon.pk)
    daemon.refresh_from_db(fields=["state"])
    check_live(daemon)
    running = Invocation.objects.filter(daemon=daemon, state=RUNNING)
    return {
        "state": daemon.state,
        "running": [str(pk) for pk in running.values_list("id", flat=True)],
        "commands": commands_deliver(daemon.pk),
    }


# ---------------------------------------------------------------------------- ending


def daemon_deregister(*, daemon: Daemon) -> dict:
    """The daemon leaves (after SIGTERM, once its work is done). Anything it still held
    goes back to the queue while attempts remain."""
    return _end([daemon.pk], requeue=True, reason="daemon left")[0]


def daemon_drop(*, daemon: Daemon) -> dict:
    """An operator drops the daemon: it is terminated, its provider is asked to stop it,
    and its running invocations end killed. The daemon learns it at its next heartbeat
    or claim (409 daemon_terminated) and stops."""

    ended = _end([daemon.pk], requeue=False, reason="daemon removed")[0]
    if not ended["terminated"]:
        return ended  # it had already ended: nothing was done, nothing to record
    audit.record(
        "daemon.drop",
        queue=daemon.queues[0] if len(daemon.queues) == 1 else "",
        target=f"daemon {daemon.pk}",
        summary=f"dropped {daemon.name} (serving "
        f"{', '.join(daemon.queues) or 'the default queue'})",
    )
    return ended


def _end(daemon_ids: list[int], *, requeue: bool, reason: str, states=None) -> list[dict]:
    """Terminate these daemons (those still in `states`), hand back or kill what they
    ran, revoke their minted tokens; after commit, ask their providers to stop them."""
    now = timezone.now()
    states = states or [s for s in DaemonState.values if s != DaemonState.TERMINATED]
    with transaction.atomic():
        ended = list(
            Daemon.objects.select_for_update(of=("self",))
            .filter(pk__in=daemon_ids, state__in=states)
            .select_related("provider")
        )
        ids = [d.pk for d in ended]
        Daemon.objects.filter(pk__in=ids).update(state=DaemonState.TERMINATED, updated_at=now)
        if requeue:
            outcome = rescue.requeue_daemon_work(daemon_ids=ids, reason=reason)
        else:
            outcome = {"requeued": 0, "failed": 0}
            outcome["killed"] = kill.kill_daemon_work(daemon_ids=ids, reason=reason)
        revoke_tokens(Daemon.objects.filter(pk__in=ids))
        _wake_waiting_claims(ended)
        for daemon in ended:
            if daemon.provider_id:
                transaction.on_commit(lambda d=daemon: _release(d))
    ended_ids = set(ids)
    return [
        {
            "id": str(pk),
            "terminated": pk in ended_ids,
            "requeued": outcome["requeued"],
            "ended": outcome.get("killed", outcome["failed"]),
        }
        for pk in daemon_ids
    ]


def _wake_waiting_claims(ended: list[Daemon]) -> None:
    """A claim an ended daemon has waiting (a long-poll) wakes at commit, looks again,
    and answers 409 daemon_terminated at once instead of when its wait is over. The
    notification is the one new work sends on its queue (jobs/wakeup.py): the other
    daemons of those queues look once more and wait again."""
    names = sorted({name for daemon in ended for name in (daemon.queues or [""])})
    if names:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_notify(%s, name) FROM unnest(%s::text[]) AS name",
                [WORK_CHANNEL, names],
            )


def _release(daemon: Daemon) -> None:
    """After commit: the provider stops what runs the daemon (never inside a
    transaction that could still roll back)."""
    try:
        driver_for(daemon.provider).release(daemon=daemon)
    except Exception as exc:  # noqa: BLE001 - the provider's failure goes in the audit trail
        _audit(daemon, EventAction.TERMINATE_FAILED, f"{daemon.name}: {exc}", delta=0)


def revoke_tokens(daemons) -> int:
    """Revoke the daemons' own credentials (never an SDK worker's polling token, which
    is its user's)."""
    return ApiToken.objects.filter(
        pk__in=daemons.exclude(token__isnull=True).values("token_id"),
        bound=True,
        revoked_at__isnull=True,
    ).update(revoked_at=timezone.now())


def daemons_gone(*, daemon_ids: list[int], reason: str) -> list[dict]:
    """The provider reports these daemons gone (their process exited): end them; what
    they ran goes back to the queue while attempts remain."""
    live_or_lost = [*LIVE_DAEMON_STATES, DaemonState.LOST]
    return _end(daemon_ids, requeue=True, reason=reason, states=live_or_lost)


def daemons_provider_lost(*, daemon_ids: list[int], reason: str, release: bool) -> list[int]:
    """The provider says these daemons are gone (their Slurm job ended) or must go (it
    runs while the daemon is silent): lost at once, without waiting for the heartbeat
    timeout. What they ran goes back to the queue while attempts remain, their minted
    tokens are revoked (nothing may speak for them again), and with `release` the
    provider stops what still runs them, after commit."""
    with transaction.atomic():
        lost = list(
            Daemon.objects.select_for_update(of=("self",))
            .filter(pk__in=daemon_ids, state__in=[*LIVE_DAEMON_STATES, DaemonState.LOST])
            .select_related("provider")
        )
        ids = [d.pk for d in lost]
        Daemon.objects.filter(pk__in=ids).update(state=DaemonState.LOST, updated_at=timezone.now())
        rescue.requeue_daemon_work(daemon_ids=ids, reason=f"daemon lost ({reason})")
        revoke_tokens(Daemon.objects.filter(pk__in=ids))
        for daemon in lost:
            _audit(daemon, EventAction.DAEMON_LOST, f"{daemon.name}: {reason}", delta=-1)
            if release and daemon.provider_id:
                transaction.on_commit(lambda d=daemon: _release(d))
    return ids


def _audit(daemon: Daemon, action: str, reason: str, *, delta: int) -> None:
    """An event, outside any tick, on the daemon's (first) queue."""

    queue = Queue.objects.filter(name__in=daemon.queues).first()
    if queue is not None:
        queue_event_now(queue, action=action, reason=reason, delta=delta)


# ---------------------------------------------------------------------------- scale-down


def daemons_retire(*, daemon_ids: list[int]) -> list[int]:
    """Scale-down, step 1: idle → draining, for each daemon that is idle *and runs
    nothing at this moment*, in one conditional update. A daemon that claimed work
    meanwhile is busy and is left alone; a draining daemon claims nothing more."""
    with connection.cursor() as cursor:
        cursor.execute(
            """UPDATE fleet_daemon d SET state = %(draining)s, updated_at = now()
                WHERE d.id = ANY(%(ids)s) AND d.state = %(idle)s
                  AND NOT EXISTS (SELECT 1 FROM jobs_invocation i
                                   WHERE i.daemon_id = d.id AND i.state = %(running)s)
               RETURNING d.id""",
            {
                "ids": list(daemon_ids),
                "draining": DaemonState.DRAINING.value,
                "idle": DaemonState.IDLE.value,
                "running": RUNNING,
            },
        )
        return [row[0] for row in cursor.fetchall()]


def daemons_end_drained(queryset) -> list[int]:
    """Scale-down, step 2: end the draining daemons of `queryset` that run nothing."""

    busy = Invocation.objects.filter(state=RUNNING).values("daemon_id")
    ids = list(
        queryset.filter(state=DaemonState.DRAINING)
        .exclude(pk__in=busy)
        .values_list("pk", flat=True)
    )
    if not ids:
        return []
    ended = _end(ids, requeue=True, reason="scaled down", states=[DaemonState.DRAINING])
    return [int(row["id"]) for row in ended if row["terminated"]]


# ---------------------------------------------------------------------------- reaper


# Silent past the heartbeat timeout, or an SDK worker with no job silent past
# sdk_idle_silence(), except an SDK worker within the lease of a job it runs: it sends
# nothing while it works, so its last poll or result chunk counts, for the job's
# timeout_s (its run_config's) or LAKESHORE_SDK_LEASE_SECONDS.
_SILENT_SQL = """
SELECT d.id FROM fleet_daemon d
 WHERE d.state = ANY(%(live)s)
   AND (d.last_heartbeat_at < %(cutoff)s
        OR (d.worker_id IS NOT NULL AND d.last_heartbeat_at < %(idle_cutoff)s
            AND NOT EXISTS (SELECT 1 FROM jobs_invocation i
                             WHERE i.daemon_id = d.id AND i.state = %(running)s)))
   AND NOT (d.worker_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM jobs_invocation i
         WHERE i.daemon_id = d.id AND i.state = %(running)s
           AND d.last_heartbeat_at
               >= %(now)s - make_interval(secs => COALESCE(i.timeout_s, %(lease)s))))
   FOR UPDATE OF d SKIP LOCKED
"""


def sdk_idle_silence() -> float:
    """Seconds an SDK worker with no job may go without a poll. It polls again as soon
    as a poll ends (each waits at most POLL_MAX_SECONDS, renewed by the time it starts,
    written at most every write_every()), and it never says goodbye: past this it has
    stopped, and it is lost well before the heartbeat timeout other daemons get."""
    return min(POLL_MAX_SECONDS + write_every() + SDK_POLL_GRACE_SECONDS, _heartbeat_timeout())


def _heartbeat_timeout() -> float:
    return float(settings.LAKESHORE_HEARTBEAT_TIMEOUT)


def daemons_mark_lost(*, now=None) -> list[int]:
    """Live daemons silent past LAKESHORE_HEARTBEAT_TIMEOUT become lost, and SDK
    workers with no job silent past sdk_idle_silence() (rows another transaction holds —
    a claim in flight — are looked at next time). An SDK worker running a job is held by
    its lease instead (_SILENT_SQL)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=_heartbeat_timeout())
    params = {
        "live": [str(s) for s in LIVE_DAEMON_STATES],
        "cutoff": cutoff,
        "idle_cutoff": now - timedelta(seconds=sdk_idle_silence()),
        "now": now,
        "running": RUNNING,
        "lease": settings.LAKESHORE_SDK_LEASE_SECONDS,
    }
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_SILENT_SQL, params)
            lost = [row[0] for row in cursor.fetchall()]
        Daemon.objects.filter(pk__in=lost).update(state=DaemonState.LOST, updated_at=now)
    return lost


def reap(*, now=None) -> dict:
    """Daemons silent past the heartbeat timeout become lost. Running invocations whose
    daemon is no longer live (lost, terminated, deleted) go back to the queue while
    attempts remain, else fail ("daemon gone"). Invocations past timeout_s become
    timeout. Safe to run twice at once: every change is conditional."""
    now = now or timezone.now()
    lost = daemons_mark_lost(now=now)
    with transaction.atomic():
        rescued = rescue.rescue_orphans()
    timed_out = completion.timeout_overdue(now=now)
    return {"lost": len(lost), **rescued, "timeout": timed_out}


def commands_deliver(daemon_id: int) -> list[dict]:
    """This daemon's undelivered orders, marked delivered: each goes out once."""
    with connection.cursor() as cursor:
        cursor.execute(
            """UPDATE fleet_daemoncommand SET delivered_at = now()
                WHERE daemon_id = %s AND delivered_at IS NULL
            RETURNING id, verb, signal, invocation_id, requested_by""",
            [daemon_id],
        )
        rows = sorted(cursor.fetchall())
    return [
        {"id": str(pk), "verb": verb, "signal": sig, "invocation": str(inv), "by": by}
        for pk, verb, sig, inv, by in rows
    ]
