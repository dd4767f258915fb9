"""The daemon protocol's claim and completion: a daemon takes queued invocations of its
queues (each to exactly one daemon, in its queues' order and each queue's kind) and
reports how they ended. Its doors: POST /api/v1/daemons/ID/claim|exchange|complete/
(fleet/api/protocol_views.py, and the lean path) and the SDK worker's poll and ack
(fleet/sdk_worker.py). The state changes themselves are in jobs/transitions/."""

import random
import threading
import time
from collections.abc import Callable, Generator

from django.db import connection, transaction

from fleet import daemons, parked
from fleet.models import Daemon, DaemonState
from jobs import waits, wakeup
from jobs.claim_room import ClaimRoom
from jobs.models import Invocation, InvocationState, Wire
from jobs.services import boltzmann_pick, levels_for, levels_learnt
from jobs.transitions import claim, completion
from lakeshore_admin import hooks
from lakeshore_admin.errors import Conflict, NotFound
from queues.models import Queue, QueueKind

Q_ = InvocationState


_ORDER = {QueueKind.FIFO: "oldest", QueueKind.FILO: "newest", QueueKind.PRIORITY: "priority"}


def _claim_boltzmann(
    daemon_id: int,
    queue: Queue,
    limit: int,
    rng: random.Random,
    wires=None,
    room: ClaimRoom | None = None,
) -> tuple[list[Invocation], bool]:
    """What it claimed, and whether it ran a claim statement at all (which locks the
    daemon's row) or found no level with work."""
    room = room or ClaimRoom()
    levels = levels_for(queue)
    claimed: list[Invocation] = []
    recounted = ran = False
    while len(claimed) < limit and not room.full():
        if not levels:
            if recounted:
                break
            levels, recounted = levels_for(queue, fresh=True), True
            continue
        level = boltzmann_pick(levels, queue.temperature, rng)
        ran = True
        got = room.took(
            claim.claim(
                daemon_id=daemon_id,
                queue=queue.name,
                order="oldest",
                limit=1,
                priority=level,
                wires=wires,
                **room.left(),
            )
        )
        claimed.extend(got)
        # taken, or found empty (another daemon got there first): count it down
        levels[level] = levels[level] - 1 if got else 0
        if levels[level] <= 0:
            del levels[level]
    levels_learnt(queue, levels)  # for the next claim in this process
    return claimed, ran


QUEUE_ROWS_TTL = 2.0  # seconds a process reuses a queue's row (kind, temperature)


_queue_rows: dict[str, tuple[float, Queue | None]] = {}


_queue_rows_lock = threading.Lock()


def _queues_of(names: list[str]) -> list[Queue | str]:
    """The daemon's queues in its order ('' = default), skipping names with no queue.
    Their rows (kind, temperature) are reused for QUEUE_ROWS_TTL s per process: a
    claim costs no queue query. Whether a queue dispatches now (not paused) is checked
    by the claim statement itself, never from this cache."""
    if not names:
        return [""]
    now = time.monotonic()
    with _queue_rows_lock:
        stale = [
            n
            for n in names
            if now - _queue_rows.get(n, (-QUEUE_ROWS_TTL, None))[0] >= QUEUE_ROWS_TTL
        ]
    if stale:
        found = {q.name: q for q in Queue.objects.filter(name__in=stale)}
        with _queue_rows_lock:
            for name in stale:
                _queue_rows[name] = (now, found.get(name))
    with _queue_rows_lock:
        rows = [_queue_rows.get(n, (now, None))[1] for n in names]
    return [row for row in rows if row is not None]


def forget_queue_rows() -> None:
    """Drop the reused queue rows (a test's database is rolled back under them)."""
    with _queue_rows_lock:
        _queue_rows.clear()


def claim_steps(
    *,
    daemon: Daemon,
    limit: int = 1,
    wait: float = 0.0,
    rng: random.Random | None = None,
    wires: list[str] | None = None,
    tell_draining: bool = False,
    recheck: Callable[[], None] | None = None,
    heard: int | None = None,
    since: float | None = None,
) -> Generator[waits.Wait, bool | None, list[Invocation]]:
    """Hand up to `limit` queued invocations of the daemon's queues to it, each to
    exactly one daemon. Queues are served in the daemon's order; a draining daemon
    gets nothing; a terminated or lost one gets a Conflict (daemon_terminated,
    daemon_lost). With `wait`, an empty claim waits until its queues get work (LISTEN/
    NOTIFY, jobs/wakeup.py) or the wait ends, holding no database connection; a wait
    refused a slot (jobs/waits.py) answers at once, its `retry_after` set.
    `wires` says what the daemon can run: JSON invocations by default (this project's
    daemon), the SDK's blobs for an SDK worker.

    As steps: it yields a waits.Wait where it would wait, and is sent back whether it
    was woken (True), its time ran out (False) or the wait was refused (None); it
    returns what it claimed. A WSGI door drives it in its thread (waits.drive), the
    ASGI door on the event loop (waits.drive_async). `tell_draining`: a draining daemon's
    claim answers at once (its answer says so: the daemon stops claiming) rather than
    wait out its time. `recheck`: called when it wakes, before it looks again (the
    caller's credential, which may have been revoked while it waited, raises).
    `heard`: daemon_heard(daemon's id), taken before the caller loaded the daemon: a
    change of the daemon's state (a drain) committed after that load wakes the wait.
    `since`: when (time.monotonic()) the request arrived, if the server knows: time it
    spent queued for a thread counts in its wait. A long wait ends at its daemon's phase
    (parked.wait_ends)."""
    rng = rng or random.Random()  # noqa: S311 - scheduling, not security
    wires = [Wire.JSON] if wires is None else wires
    wait = min(wait, parked.longest_wait())
    deadline = parked.wait_ends(daemon.pk, wait, time.monotonic() if since is None else since)
    fresh = True  # the caller just loaded the daemon
    while True:
        if not fresh:
            heard = daemon_heard(daemon.pk) if wait else None  # before the row is read
            if recheck is not None:
                recheck()
            daemons.refresh_live(daemon)
        daemons.check_live(daemon)
        # its queues (paused ones too: a resume wakes them), and itself (a drain)
        listening = [*(daemon.queues or [""]), f"daemon:{daemon.pk}"]
        seen = wakeup.listener.snapshot(listening) if wait else ()
        if seen and heard is not None:  # its own channel as it was before its row was read
            seen = (*seen[:-1], heard)
        # a long-poll first asks whether anything is queued at all: one indexed read in
        # place of a transaction (a woken one too: others may have been woken with it)
        claimed = _claim_once(daemon, limit, rng, wires, probe=wait > 0)
        fresh = False
        if len(claimed) >= limit:  # there may be more: the next waiters' turn
            wakeup.listener.relay(listening)
        left = deadline - time.monotonic()
        if claimed or left <= 0 or (tell_draining and daemon.state == DaemonState.DRAINING):
            return claimed
        if not connection.in_atomic_block:
            connection.close()  # hold no connection while waiting
        # parked: this process renews the daemon while it waits (fleet/parked.py)
        woken = yield waits.Wait(
            listening, seen, left, renew=(parked.PARKED, daemon.pk), ends_quietly=True
        )
        if woken is None:  # no room for another wait (LAKESHORE_MAX_WAITS)
            return waits.refused(claimed, wait)
        if not woken:  # no query from here on (ends_quietly): the answer is empty
            return []


def _none_queued(names: list[str]) -> bool:
    """Whether none of these queues holds a queued row: known without a query when this
    process found them empty and heard of nothing queued there since (an idle fleet's
    polls), else one indexed read (whose answer it keeps: jobs/wakeup.note_empty)."""
    if wakeup.listener.known_empty(names):
        return True
    mark = wakeup.listener.empty_mark(names)
    if claim.any_queued(names):
        return False
    wakeup.listener.note_empty(names, mark)
    return True


def daemon_heard(daemon_id) -> int:
    """Where the daemon's own channel (`daemon:ID`: a drain, its end, its token's
    revocation) stands now: taken before its row is read, a claim's wait then wakes for
    any change committed after."""
    return wakeup.listener.snapshot([f"daemon:{daemon_id}"])[0]


HEARD = "lakeshore.daemon_heard"  # the request's environ key (hear_on_arrival)


def hear_on_arrival(environ, daemon_id) -> None:
    """Note daemon_heard in a claim's or an exchange's environ as it arrives, before
    its credential is read: a revocation committed between that read and the claim's
    wait then wakes the wait (its check of the credential answers token_revoked),
    where a note taken after the read would already count it and sleep through."""
    environ.setdefault(HEARD, daemon_heard(daemon_id))  # the earliest note stands


def heard_on_arrival(environ, daemon_id) -> int:
    """What hear_on_arrival noted, else where the channel stands now."""
    heard = environ.get(HEARD)
    return daemon_heard(daemon_id) if heard is None else heard


def _claim_once(
    daemon: Daemon,
    limit: int,
    rng: random.Random,
    wires=None,
    *,
    probe: bool = False,
) -> list[Invocation]:
    claimed: list[Invocation] = []
    if daemon.state == DaemonState.DRAINING:
        if daemons.heartbeat_due(daemon):
            daemons.touch(daemon.pk)
        return claimed
    queues = _queues_of(daemon.queues)
    if probe:
        # A long-poll: when none of its queues holds a queued row there is nothing to
        # take, and the claim statements below would only say so. (A row queued after
        # this look wakes the wait: the caller's snapshot was taken before it.) It sets
        # a busy daemon idle, in touch's own statement, and renews one whose heartbeat is
        # as old as a renewal's turn; while it waits, the renewal keeps it (parked.py).
        names = [q if isinstance(q, str) else q.name for q in queues]
        if _none_queued(names):
            if daemons.idle_owed(daemon, parking=True):
                daemons.touch(daemon.pk)
            hooks.point("claim.probed_empty")
            return claimed
    # One transaction for the claims and the touch: if anything in it fails (the
    # database restarting, say), nothing was taken, so no answer is lost with work in it.
    # A claim that takes work marks its daemon busy in its own statement; one that
    # finds nothing touches a busy daemon (back to idle unless it still runs something).
    with transaction.atomic():
        hooks.point("claim.before_statement")
        locked = False  # whether a claim statement ran: it locks the daemon's row
        room = ClaimRoom()  # the answer's bytes (LAKESHORE_CLAIM_MAX_BYTES)
        for queue in queues:
            want = limit - len(claimed)
            if want <= 0 or room.full():
                break
            if isinstance(queue, str):
                claimed += room.took(
                    claim.claim(
                        daemon_id=daemon.pk,
                        queue=queue,
                        order="oldest",
                        limit=want,
                        wires=wires,
                        **room.left(),
                    )
                )
                locked = True
            elif queue.kind == QueueKind.BOLTZMANN:
                got, ran = _claim_boltzmann(daemon.pk, queue, want, rng, wires, room)
                claimed += got
                locked = locked or ran
            else:
                claimed += room.took(
                    claim.claim(
                        daemon_id=daemon.pk,
                        queue=queue.name,
                        order=_ORDER[queue.kind],
                        limit=want,
                        wires=wires,
                        **room.left(),
                    )
                )
                locked = True
        hooks.point("claim.before_touch")
        if daemons.heartbeat_due(daemon) or (not claimed and daemons.idle_owed(daemon)):
            daemons.touch(daemon.pk, locked=locked)
        hooks.point("claim.before_commit")
    return claimed


def invocation_complete(
    *,
    daemon: Daemon,
    invocation_id: int,
    attempt: int,
    outcome: str = "succeeded",
    succeeded: bool | None = None,
    result=None,
    error: str = "",
    result_blob: bytes | None = None,
    retry: bool = True,
) -> Invocation:
    """Record an outcome: succeeded (with a JSON result, or the SDK's result bytes),
    failed (with an error) or timeout (the daemon stopped it at timeout_s). Fenced by
    daemon and attempt: a daemon that lost its claim (reaped, killed, re-dispatched)
    gets a Conflict (claim_stale) and changes no state. When an operator's kill took
    the claim while the job was finishing, the outcome it reported is kept as discarded
    (the Conflict's `state` says killed, its `reason` who killed it). Of an invocation
    it never held (another daemon's, another attempt, or none such) the answer says
    nothing, not even whether it exists. A retry of a report that was recorded (its
    response lost) gets the stored row. A failure with attempts left goes back to the
    queue after a back-off, unless `retry` is False (the SDK's worker says when a
    failure is final)."""
    if succeeded is not None:
        outcome = "succeeded" if succeeded else "failed"
    hooks.point("complete.before_statement")
    invocation = _complete_one(
        daemon, invocation_id, attempt, outcome, result, error, result_blob, retry
    )
    daemons.completed(daemon)
    return invocation


def invocation_complete_batch(
    *, daemon: Daemon, outcomes: list[dict], claim_follows: bool = False
) -> list[dict]:
    """Many outcomes in one request and one transaction, each fenced alone: a stale one
    is refused by itself and the others are recorded. A daemon that is no longer live
    records nothing: the whole batch gets its Conflict (daemon_terminated, daemon_lost),
    unless the batch is a retry of reports already recorded, which still answer ok.
    `claim_follows`: a claim comes next (an exchange), which says busy or idle."""
    try:
        daemons.check_live(daemon)
    except Conflict as gone:
        return _answers_of_a_gone_daemon(daemon, outcomes, gone)
    answers = []
    ids = [int(item["invocation"]) for item in outcomes]
    with transaction.atomic():
        hooks.point("complete.before_statement")
        # The common case in one statement; what it did not record (stale, repeated,
        # unknown, or an id twice in the batch) goes the careful way, one by one.
        recorded = (
            completion.complete_many(daemon_id=daemon.pk, outcomes=outcomes)
            if len(set(ids)) == len(ids)
            else {}
        )
        for item in outcomes:
            row = recorded.get(int(item["invocation"]))
            if row is not None:
                answers.append(_recorded(row))
                continue
            try:
                invocation = _complete_one(
                    daemon,
                    item["invocation"],
                    item["attempt"],
                    item["state"],
                    item.get("result"),
                    item.get("error", ""),
                    item.get("result_blob"),
                    item.get("retry", True),
                )
            except (Conflict, NotFound) as exc:
                answers.append(_refused(item, exc))
            else:
                answers.append(_recorded(invocation))
        daemons.completed(daemon, claim_follows=claim_follows)
    return answers


def exchange_steps(
    *,
    daemon: Daemon,
    outcomes: list[dict],
    limit: int,
    wait: float = 0.0,
    wires=None,
    tell_draining: bool = False,
    recheck: Callable[[], None] | None = None,
    heard: int | None = None,
    since: float | None = None,
) -> Generator[waits.Wait, bool | None, dict]:
    """Report outcomes and claim more in one call: invocation_complete_batch, then
    claim_steps, each with its own rules and transaction. Answers
    {"recorded": [the batch's answers], "claimed": [Invocation, ...]}.

    No outcomes: only a claim. `limit` 0: nothing is claimed. A daemon that is no longer
    live claims nothing: its batch raises its Conflict, or, when it is a retry of reports
    already recorded, answers them and the claim does not run. Outcomes commit before the
    claim starts: a claim that then fails (a Conflict, the database going away) leaves
    them recorded, and a retry of the same outcomes answers them as recorded."""
    recorded = (
        invocation_complete_batch(daemon=daemon, outcomes=outcomes, claim_follows=limit > 0)
        if outcomes
        else []
    )
    try:
        daemons.check_live(daemon)
    except Conflict:
        if not recorded:
            raise
        return {"recorded": recorded, "claimed": []}
    claimed = (
        (
            yield from claim_steps(
                daemon=daemon,
                limit=limit,
                wait=wait,
                wires=wires,
                tell_draining=tell_draining,
                recheck=recheck,
                heard=heard,
                since=since,
            )
        )
        if limit
        else []
    )
    return {"recorded": recorded, "claimed": claimed}


def _answers_of_a_gone_daemon(daemon, outcomes, gone: Conflict) -> list[dict]:
    rows = Invocation.objects.in_bulk([item["invocation"] for item in outcomes])
    answers, any_recorded = [], False
    for item in outcomes:
        row = rows.get(item["invocation"])
        seen = row is not None and completion.already_recorded(
            row, daemon_id=daemon.pk, attempt=item["attempt"], outcome=item["state"]
        )
        any_recorded |= bool(seen)
        answers.append(_recorded(row) if seen else _refused(item, gone))
    if not any_recorded:
        raise gone
    return answers


def _recorded(invocation: Invocation) -> dict:
    return {"invocation": str(invocation.pk), "ok": True, "state": invocation.state}


def _refused(item: dict, exc) -> dict:
    error = {"code": exc.code, "message": exc.message, **exc.extra}
    return {"invocation": str(item["invocation"]), "ok": False, "error": error}


def _complete_one(
    daemon, invocation_id, attempt, outcome, result, error, result_blob=None, retry=True
) -> Invocation:
    recorded = completion.complete(
        daemon_id=daemon.pk,
        invocation_id=invocation_id,
        attempt=attempt,
        outcome=outcome,
        result=result,
        error=error,
        result_blob=result_blob,
        retry=retry,
    )
    if recorded is not None:
        return recorded
    current = (
        completion.record_discarded_outcome(
            daemon_id=daemon.pk, invocation_id=invocation_id, attempt=attempt, outcome=outcome
        )
        or Invocation.objects.filter(pk=invocation_id).first()
    )
    held = current is not None and current.daemon_id == daemon.pk and current.attempts == attempt
    if not held:  # another daemon's, another attempt, or none such: nothing is said of it
        raise Conflict(
            f"Invocation {invocation_id} attempt {attempt} is not yours to complete; the "
            "outcome was not recorded.",
            code="claim_stale",
        )
    seen = completion.already_recorded(
        current, daemon_id=daemon.pk, attempt=attempt, outcome=outcome
    )
    if seen:
        return current
    if seen is False:
        raise Conflict(
            f"Invocation {invocation_id} attempt {attempt} was already reported as "
            f"{current.state}; the outcome {outcome} was not recorded.",
            extra={"state": current.state},
            code="already_completed",
        )
    if current.finished_before_kill:  # the kill came first: its page says what was discarded
        raise Conflict(
            f"Invocation {invocation_id} was killed before this report came "
            f"({current.reason}); the outcome {outcome} was not recorded: the job's page "
            f"shows it as discarded.",
            extra={"state": current.state, "reason": current.reason},
            code="claim_stale",
        )
    raise Conflict(  # this daemon's attempt, taken away (killed, or a drop requeued it)
        f"Invocation {invocation_id} is no longer yours to complete (it is "
        f"{current.state}); the outcome was not recorded.",
        extra={"state": current.state},
        code="claim_stale",
    )
