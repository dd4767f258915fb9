"""Invocations: submit, claim, complete, kill, bulk-cancel, reap. Every state change is
a conditional UPDATE (or SELECT … FOR UPDATE SKIP LOCKED), so two processes racing on
the same row can never both win (STYLE 4)."""

import math
import random
import re
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from jobs.models import Invocation, InvocationState
from lakeshore_admin.errors import BacklogFull, Conflict, Invalid, NotFound
from queues.models import (
    DISPATCHING_QUEUE_STATES,
    LIVE_DAEMON_STATES,
    Daemon,
    DaemonState,
    Queue,
    QueueKind,
)

FUNCTION_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
POSITION_CAP = 10_000
Q_ = InvocationState


# ---------------------------------------------------------------------------- submit


def _admitting_queue(name: str) -> Queue | None:
    """The queue to submit into, or None for the default queue ('')."""
    if not name:
        return None
    try:
        queue = Queue.objects.get(name=name)
    except Queue.DoesNotExist:
        raise NotFound(f"Queue '{name}' does not exist.", fields={"queue": "unknown"}) from None
    if not queue.admits_submissions:
        raise Conflict(
            f"Queue '{name}' is {queue.state} and admits no new work "
            f"('lakeshore queues unarchive {name}' reopens it).",
            extra={"state": queue.state},
        )
    return queue


def _queued_depth(name: str, cap: int) -> int:
    return (
        Invocation.objects.filter(queue=name, state=Q_.QUEUED).order_by().values("id")[:cap].count()
    )


def _lock_queue_admission(name: str) -> None:
    """Serialise admissions to one bounded queue (transaction-scoped advisory lock), so
    concurrent submits cannot overshoot max_depth."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"lakeshore-queue:{name}"])


def _check_function(function: str) -> None:
    if not FUNCTION_PATTERN.match(function or ""):
        raise Invalid(
            f"function must be a dotted path such as 'package.module.name', got {function!r}.",
            fields={"function": "not a dotted path"},
        )


def invocation_submit(
    *,
    function: str,
    queue: str = "",
    args: list | None = None,
    kwargs: dict | None = None,
    priority: int = 0,
    key: str = "",
    timeout_s: int | None = None,
    max_attempts: int = 1,
    block_timeout: float | None = None,
) -> tuple[Invocation, bool]:
    """Queue one invocation. Returns (invocation, created); with an idempotency `key`
    already used in that queue, the first invocation comes back with created=False."""
    _check_function(function)
    queue = queue or ""
    if key:
        existing = Invocation.objects.filter(queue=queue, key=key).first()
        if existing is not None:
            return existing, False
    row = _admitting_queue(queue)
    deadline = time.monotonic() + (
        settings.LAKESHORE_BLOCK_TIMEOUT if block_timeout is None else block_timeout
    )
    while True:
        try:
            with transaction.atomic():
                if row is not None and row.max_depth:
                    _lock_queue_admission(queue)
                    depth = _queued_depth(queue, row.max_depth)
                    if depth >= row.max_depth:
                        raise BacklogFull(
                            f"Queue '{queue}' is full: {depth} queued (max_depth "
                            f"{row.max_depth}, on_full={row.on_full}).",
                            extra={"depth": depth, "max_depth": row.max_depth},
                        )
                invocation = Invocation.objects.create(
                    queue=queue,
                    function=function,
                    args=args or [],
                    kwargs=kwargs or {},
                    priority=priority,
                    key=key,
                    timeout_s=timeout_s,
                    max_attempts=max_attempts,
                )
            return invocation, True
        except IntegrityError:
            # Another submit with the same key won the race: answer with its row.
            existing = Invocation.objects.filter(queue=queue, key=key).first()
            if key and existing is not None:
                return existing, False
            raise
        except BacklogFull:
            if row.on_full != "block" or time.monotonic() >= deadline:
                raise
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
            row = _admitting_queue(queue)  # it may have been drained meanwhile


# ---------------------------------------------------------------------------- claim

_CLAIM_SQL = """
UPDATE jobs_invocation
   SET state = 'running', daemon_id = %(daemon)s, attempts = attempts + 1,
       started_at = now(), error = ''
 WHERE id = ANY(ARRAY(
        SELECT id FROM jobs_invocation
         WHERE queue = %(queue)s AND state = 'queued' {extra}
         ORDER BY {order}
         LIMIT %(limit)s
         FOR UPDATE SKIP LOCKED))
RETURNING *
"""
_ORDER = {
    QueueKind.FIFO: "id",
    QueueKind.FILO: "id DESC",
    QueueKind.PRIORITY: "priority DESC, id",
}


def _claim_in_order(
    daemon_id: int, queue: str, order: str, limit: int, extra: str = "", **p
) -> list[Invocation]:
    sql = _CLAIM_SQL.format(order=order, extra=extra)
    params = {"daemon": daemon_id, "queue": queue, "limit": limit, **p}
    return sorted(Invocation.objects.raw(sql, params), key=_claim_key[order])


_claim_key = {
    "id": lambda inv: inv.pk,
    "id DESC": lambda inv: -inv.pk,
    "priority DESC, id": lambda inv: (-inv.priority, inv.pk),
}


def boltzmann_levels(queue: str) -> dict[int, int]:
    """Queued invocations per priority level (an index-only scan of the partial index)."""
    rows = (
        Invocation.objects.filter(queue=queue, state=Q_.QUEUED)
        .order_by()
        .values_list("priority")
        .annotate(n=Count("id"))
    )
    return dict(rows)


LEVELS_TTL = 2.0  # seconds a process reuses a queue's level counts
_levels_cache: dict[int, tuple[float, dict[int, int]]] = {}
_levels_lock = threading.Lock()


def _levels_for(queue: Queue, *, fresh: bool = False) -> dict[int, int]:
    """Level counts, counted at most every LEVELS_TTL seconds per queue and process, so
    a claim does not scan the backlog. Counts a few seconds old only nudge the odds; a
    level found empty is dropped at once, and an empty answer is always recounted."""
    now = time.monotonic()
    if not fresh:
        with _levels_lock:
            hit = _levels_cache.get(queue.pk)
        if hit and now - hit[0] < LEVELS_TTL and hit[1]:
            return dict(hit[1])
    levels = boltzmann_levels(queue.name)
    with _levels_lock:
        _levels_cache[queue.pk] = (now, levels)
    return dict(levels)


def boltzmann_pick(levels: dict[int, int], temperature: float, rng: random.Random) -> int:
    """A priority level with probability ∝ count × exp((p − p_max) / T): each queued
    invocation weighs exp(p / T), so low priorities are delayed, never starved."""
    top = max(levels)
    weights = [(p, n * math.exp((p - top) / temperature)) for p, n in levels.items() if n > 0]
    total = sum(w for _, w in weights)
    point = rng.random() * total
    for level, weight in weights:
        point -= weight
        if point < 0:
            return level
    return weights[-1][0]


def _claim_boltzmann(
    daemon_id: int, queue: Queue, limit: int, rng: random.Random
) -> list[Invocation]:
    levels = _levels_for(queue)
    claimed: list[Invocation] = []
    recounted = False
    while len(claimed) < limit:
        if not levels:
            if recounted:
                break
            levels, recounted = _levels_for(queue, fresh=True), True
            continue
        level = boltzmann_pick(levels, queue.temperature, rng)
        got = _claim_in_order(
            daemon_id, queue.name, "id", 1, extra="AND priority = %(level)s", level=level
        )
        claimed.extend(got)
        # taken, or found empty (another daemon got there first): count it down
        levels[level] = levels[level] - 1 if got else 0
        if levels[level] <= 0:
            del levels[level]
    with _levels_lock:  # what this claim learnt, for the next one in this process
        if queue.pk in _levels_cache:
            _levels_cache[queue.pk] = (_levels_cache[queue.pk][0], levels)
    return claimed


def _dispatching(names: list[str]) -> list[Queue | str]:
    """The daemon's queues that dispatch now, in the daemon's order ('' = default)."""
    if not names:
        return [""]
    rows = {
        q.name: q for q in Queue.objects.filter(name__in=names, state__in=DISPATCHING_QUEUE_STATES)
    }
    return [rows[n] for n in names if n in rows]


def _live_daemon(daemon: Daemon) -> Daemon:
    daemon.refresh_from_db(fields=["state", "queues"])
    if not daemon.is_live:
        raise Conflict(
            f"Daemon {daemon.pk} is {daemon.state}: register again to take work.",
            extra={"state": daemon.state},
        )
    return daemon


def invocation_claim(
    *, daemon: Daemon, limit: int = 1, wait: float = 0.0, rng: random.Random | None = None
) -> list[Invocation]:
    """Hand up to `limit` queued invocations of the daemon's queues to it, each to
    exactly one daemon. Queues are served in the daemon's order; a draining daemon
    gets nothing. Waits up to `wait` seconds when nothing is ready."""
    rng = rng or random.Random()  # noqa: S311 - scheduling, not security
    deadline = time.monotonic() + wait
    while True:
        _live_daemon(daemon)
        claimed: list[Invocation] = []
        if daemon.state != DaemonState.DRAINING:
            with transaction.atomic():
                for queue in _dispatching(daemon.queues):
                    want = limit - len(claimed)
                    if want <= 0:
                        break
                    if isinstance(queue, str):
                        claimed += _claim_in_order(daemon.pk, queue, "id", want)
                    elif queue.kind == QueueKind.BOLTZMANN:
                        claimed += _claim_boltzmann(daemon.pk, queue, want, rng)
                    else:
                        claimed += _claim_in_order(daemon.pk, queue.name, _ORDER[queue.kind], want)
                _daemon_touch(daemon, latest=claimed[-1].pk if claimed else None)
        if claimed or time.monotonic() >= deadline:
            return claimed
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


_TOUCH_SQL = """
UPDATE queues_daemon d
   SET last_heartbeat_at = now(), updated_at = now(),
       state = CASE
           WHEN d.state IN ('provisioning', 'idle', 'busy')
           THEN CASE WHEN w.running THEN 'busy' ELSE 'idle' END
           ELSE d.state END,
       current_invocation_id = CASE
           WHEN %(latest)s::bigint IS NOT NULL THEN %(latest)s::bigint
           WHEN w.running THEN d.current_invocation_id
           ELSE NULL END
  FROM (SELECT EXISTS (SELECT 1 FROM jobs_invocation
                        WHERE daemon_id = %(daemon)s AND state = 'running') AS running) w
 WHERE d.id = %(daemon)s AND d.state = ANY(%(live)s)
"""


def _daemon_touch(daemon: Daemon, latest: int | None = None) -> None:
    """Heartbeat, and busy/idle from what the daemon runs now, in one statement."""
    with connection.cursor() as cursor:
        live = [str(state) for state in LIVE_DAEMON_STATES]
        cursor.execute(_TOUCH_SQL, {"daemon": daemon.pk, "latest": latest, "live": live})


def daemon_heartbeat(*, daemon: Daemon) -> dict:
    """The daemon is alive. The answer tells it what the server believes: its state
    (draining → stop claiming) and which invocations it should still be running."""
    _live_daemon(daemon)
    _daemon_touch(daemon)
    daemon.refresh_from_db(fields=["state"])
    running = list(
        Invocation.objects.filter(daemon=daemon, state=Q_.RUNNING).values_list("id", flat=True)
    )
    return {"state": daemon.state, "running": [str(pk) for pk in running]}


def daemon_deregister(*, daemon: Daemon) -> dict:
    """The daemon leaves (after SIGTERM, once its work is done). Anything it still held
    goes back to the queue while attempts remain."""
    return _end_daemon(daemon, requeue=True, reason="daemon left")


def daemon_drop(*, daemon: Daemon) -> dict:
    """An operator drops the daemon: it is terminated and its running invocations end
    killed. The daemon learns it at its next heartbeat or claim (409) and stops."""
    return _end_daemon(daemon, requeue=False, reason="daemon removed")


def _end_daemon(daemon: Daemon, *, requeue: bool, reason: str) -> dict:
    now = timezone.now()
    with transaction.atomic():
        ended = (
            Daemon.objects.filter(pk=daemon.pk)
            .exclude(state=DaemonState.TERMINATED)
            .update(state=DaemonState.TERMINATED, current_invocation=None, updated_at=now)
        )
        held = Invocation.objects.filter(daemon=daemon, state=Q_.RUNNING)
        requeued = 0
        if requeue:
            requeued = held.filter(attempts__lt=F("max_attempts")).update(
                state=Q_.QUEUED, daemon=None, started_at=None, error=f"{reason}; requeued"
            )
            killed = held.update(state=Q_.FAILED, error=reason, finished_at=now)
        else:
            killed = held.update(state=Q_.KILLED, reason=reason, finished_at=now)
    return {"id": str(daemon.pk), "terminated": bool(ended), "requeued": requeued, "ended": killed}


# ---------------------------------------------------------------------------- complete


def invocation_complete(
    *,
    daemon: Daemon,
    invocation_id: int,
    attempt: int,
    outcome: str = "succeeded",
    succeeded: bool | None = None,
    result=None,
    error: str = "",
) -> Invocation:
    """Record an outcome: succeeded (with a JSON result), failed (with an error) or
    timeout (the daemon stopped it at timeout_s). Fenced by daemon and attempt: a daemon
    that lost its claim (reaped, killed, re-dispatched) gets a Conflict and changes
    nothing. A failure with attempts left goes back to the queue."""
    if succeeded is not None:
        outcome = "succeeded" if succeeded else "failed"
    now = timezone.now()
    mine = Invocation.objects.filter(
        pk=invocation_id, daemon=daemon, attempts=attempt, state=Q_.RUNNING
    )
    if outcome == "succeeded":
        updated = mine.update(state=Q_.SUCCEEDED, result=result, error="", finished_at=now)
    elif outcome == "timeout":
        updated = mine.update(state=Q_.TIMEOUT, error=error, finished_at=now)
    else:
        updated = mine.filter(attempts__lt=F("max_attempts")).update(
            state=Q_.QUEUED, daemon=None, started_at=None, error=error
        ) or mine.update(state=Q_.FAILED, error=error, finished_at=now)
    if not updated:
        current = Invocation.objects.filter(pk=invocation_id).first()
        if current is None:
            raise NotFound(f"Invocation {invocation_id} does not exist.")
        raise Conflict(
            f"Invocation {invocation_id} is no longer yours to complete (it is "
            f"{current.state}, attempt {current.attempts}); the outcome was not recorded.",
            extra={"state": current.state},
        )
    _daemon_touch(daemon)
    return Invocation.objects.get(pk=invocation_id)


# ---------------------------------------------------------------------------- kill / cancel


def invocation_get(invocation_id) -> Invocation:
    try:
        return Invocation.objects.select_related("daemon").get(pk=int(invocation_id))
    except (Invocation.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"Invocation '{invocation_id}' does not exist.") from None


def invocation_kill(*, invocation_id, reason: str = "") -> Invocation:
    """Queued → killed at once. Running and finished ones are a Conflict that says why."""
    invocation = invocation_get(invocation_id)
    killed = Invocation.objects.filter(pk=invocation.pk, state=Q_.QUEUED).update(
        state=Q_.KILLED, reason=reason or "killed", finished_at=timezone.now()
    )
    invocation.refresh_from_db()
    if killed:
        return invocation
    if invocation.state == Q_.RUNNING:
        raise Conflict(
            f"Invocation {invocation.pk} is running on daemon {invocation.daemon_id}: to stop "
            f"in-flight work, drop the daemon ('lakeshore daemon remove "
            f"{invocation.daemon_id}') or kill the process on it.",
            extra={"state": invocation.state, "worker": str(invocation.daemon_id)},
        )
    raise Conflict(
        f"Invocation {invocation.pk} already finished ({invocation.state}).",
        extra={"state": invocation.state},
    )


def invocation_bulk_cancel(*, queue: str | None = None, reason: str = "", dry_run: bool = False):
    """Cancel every queued invocation (of one queue, if given) in one statement."""
    rows = Invocation.objects.filter(state=Q_.QUEUED)
    if queue is not None:
        if queue and not Queue.objects.filter(name=queue).exists():
            raise NotFound(f"Queue '{queue}' does not exist.", fields={"queue": "unknown"})
        rows = rows.filter(queue=queue)
    if dry_run:
        return rows.count()
    return rows.update(state=Q_.KILLED, reason=reason or "bulk-cancel", finished_at=timezone.now())


# ---------------------------------------------------------------------------- reaper


def reap(*, now=None) -> dict:
    """Daemons silent past the heartbeat timeout become lost; their running invocations
    go back to the queue while attempts remain, else fail. Invocations past timeout_s
    become timeout. Safe to run twice at once: every change is conditional."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.LAKESHORE_HEARTBEAT_TIMEOUT)
    with transaction.atomic():
        lost = list(
            Daemon.objects.select_for_update(skip_locked=True)
            .filter(
                state__in=LIVE_DAEMON_STATES,
                last_heartbeat_at__lt=cutoff,
            )
            .values_list("id", flat=True)
        )
        Daemon.objects.filter(pk__in=lost).update(
            state=DaemonState.LOST, current_invocation=None, updated_at=now
        )
        orphans = Invocation.objects.filter(daemon_id__in=lost, state=Q_.RUNNING)
        requeued = orphans.filter(attempts__lt=F("max_attempts")).update(
            state=Q_.QUEUED, daemon=None, started_at=None, error="daemon lost; requeued"
        )
        failed = orphans.update(state=Q_.FAILED, error="daemon lost", finished_at=now)
    timed_out = _timeout_running(now)
    return {"lost": len(lost), "requeued": requeued, "failed": failed, "timeout": timed_out}


def _timeout_running(now) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE jobs_invocation
               SET state = 'timeout', finished_at = %(now)s,
                   error = 'exceeded timeout_s (' || timeout_s || ' s)'
             WHERE state = 'running' AND timeout_s IS NOT NULL
               AND started_at + make_interval(secs => timeout_s) < %(now)s
            """,
            {"now": now},
        )
        return cursor.rowcount


# ---------------------------------------------------------------------------- position


def queue_position(invocation: Invocation) -> dict | None:
    """Where a queued invocation stands: how many are ahead of it (exact for fifo, filo
    and priority; expected for boltzmann). Counts stop at POSITION_CAP."""
    if invocation.state != Q_.QUEUED:
        return None
    same = Invocation.objects.filter(queue=invocation.queue, state=Q_.QUEUED).order_by()
    queue = Queue.objects.filter(name=invocation.queue).first() if invocation.queue else None
    kind = queue.kind if queue else QueueKind.FIFO

    def capped(qs) -> int:
        return qs.values("id")[:POSITION_CAP].count()

    if kind == QueueKind.FIFO:
        ahead = capped(same.filter(id__lt=invocation.pk))
    elif kind == QueueKind.FILO:
        ahead = capped(same.filter(id__gt=invocation.pk))
    elif kind == QueueKind.PRIORITY:
        ahead = capped(
            same.filter(
                Q(priority__gt=invocation.priority)
                | Q(priority=invocation.priority, id__lt=invocation.pk)
            )
        )
    else:
        # Expected number claimed before it: older ones at its level, plus for each other
        # level the chance that one of its invocations wins a draw against this one.
        levels = _levels_for(queue)  # counted at most every LEVELS_TTL s: no scan per request
        same_level = capped(same.filter(priority=invocation.priority, id__lt=invocation.pk))
        top = max([*levels, invocation.priority])
        mine = math.exp((invocation.priority - top) / queue.temperature)
        expected = float(same_level)
        for level, count in levels.items():
            if level == invocation.priority:
                continue
            theirs = math.exp((level - top) / queue.temperature)
            if theirs + mine > 0:
                expected += count * theirs / (theirs + mine)
            elif level > invocation.priority:  # both weights underflow: T → 0 is priority
                expected += count
        return {"ahead": round(expected, 1), "exact": False, "capped": False}
    return {"ahead": ahead, "exact": True, "capped": ahead >= POSITION_CAP}
