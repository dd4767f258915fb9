"""Invocations: submit, claim, complete, kill, bulk-cancel, reap. Every state change is
a conditional UPDATE (or SELECT … FOR UPDATE SKIP LOCKED), so two processes racing on
the same row can never both win (STYLE 4)."""

import math
import random
import re
import threading
import time
from collections import Counter
from datetime import UTC, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Exists, OuterRef, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from accounts import audit
from jobs import search as job_search
from jobs import serving
from jobs.models import RETRYABLE_STATES, Invocation, InvocationState, Wire
from jobs.transitions import kill, submit
from lakeshore_admin import hooks
from lakeshore_admin.errors import BacklogFull, Conflict, DomainError, Invalid, NotFound
from queues.models import ADMITTING_QUEUE_STATES, Queue, QueueKind, QueueState

# module.path.name: two or more parts, each starting with a letter (so never private)
FUNCTION_PATTERN = re.compile(r"^[A-Za-z]\w*(\.[A-Za-z]\w*)+$")
POSITION_CAP = 10_000
_ADMITTING = [str(state) for state in ADMITTING_QUEUE_STATES]
Q_ = InvocationState


# ---------------------------------------------------------------------------- submit


def _admitting_queue(name: str, known: dict | None = None) -> Queue | None:
    """The queue to submit into, or None for the default queue ('')."""
    if not name:
        return None
    queue = known.get(name) if known is not None else Queue.objects.filter(name=name).first()
    if queue is None:
        raise NotFound(f"Queue '{name}' does not exist.", fields={"queue": "unknown"})
    if not queue.admits_submissions:
        verb = "unarchive" if queue.state == QueueState.ARCHIVED else "resume"
        raise Conflict(
            f"Queue '{name}' is {queue.state} and admits no new work "
            f"('lakeshore queues {verb} {name}' reopens it).",
            extra={"state": queue.state},
            code="queue_not_admitting",
        )
    return queue


def _queued_depth(name: str, cap: int) -> int:
    return (
        Invocation.objects.filter(queue=name, state=Q_.QUEUED).order_by().values("id")[:cap].count()
    )


def _admit(queue: Queue | None, count: int) -> None:
    """Room for `count` more in a bounded queue, or BacklogFull. Inside the caller's
    transaction, holding the queue's admission lock until it commits."""
    if queue is None or not queue.max_depth:
        return
    _lock_queue_admission(queue.name)
    depth = _queued_depth(queue.name, queue.max_depth)
    if depth + count > queue.max_depth:
        wanted = "" if count == 1 else f"; this batch adds {count}"
        raise BacklogFull(
            f"Queue '{queue.name}' is full: {depth} queued (max_depth {queue.max_depth}, "
            f"on_full={queue.on_full}){wanted}.",
            extra={"depth": depth, "max_depth": queue.max_depth},
        )


def _lock_queue_admission(name: str) -> None:
    """Serialise admissions to one bounded queue (transaction-scoped advisory lock), so
    concurrent submits cannot overshoot max_depth."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"lakeshore-queue:{name}"])


def _check_function(function: str) -> None:
    """A public dotted path. A part starting with '_' (`os._exit`, `a.__class__.b`)
    reaches what a module keeps private or Python's internals, past the daemon's
    check of allowed modules: refused whatever the daemon would say."""
    private = [part for part in (function or "").split(".") if part.startswith("_")]
    if private:
        raise Invalid(
            f"function {function!r} names a private or dunder attribute "
            f"({', '.join(repr(p) for p in private)}): only public functions can be "
            "submitted, so no part of the path may start with '_'.",
            fields={"function": "a part starts with '_' (private or dunder)"},
        )
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
    wire: str = Wire.JSON,
    args_blob: bytes | None = None,
    run_config: dict | None = None,
) -> tuple[Invocation, bool]:
    """Queue one invocation. Returns (invocation, created); with an idempotency `key`
    already used in that queue, the first invocation comes back with created=False.
    An SDK submit (jobs/sdk.py) brings its opaque `args_blob` and `run_config`, and
    a `function` that only names what the blob holds."""
    if wire == Wire.JSON:
        _check_function(function)
    queue = queue or ""
    item = {
        "queue": queue,
        "function": function,
        "args": args,
        "kwargs": kwargs,
        "priority": priority,
        "key": key,
        "timeout_s": timeout_s,
        "max_attempts": max_attempts,
        "wire": wire,
        "args_blob": args_blob,
        "run_config": run_config or {},
    }
    fresh = submit.insert_if_admitted(item, admitting=_ADMITTING)
    if fresh is not None:  # the common case, in one statement (which says who serves it)
        found = serving.Serving(queue, fresh.serving_live, fresh.serving_starts)
        return _served(fresh, found), True
    if key:
        existing = Invocation.objects.filter(queue=queue, key=key).first()
        if existing is not None:
            return _served(existing, serving.of_queue(queue), wake=False), False
    row = _admitting_queue(queue)
    deadline = time.monotonic() + (
        settings.LAKESHORE_BLOCK_TIMEOUT if block_timeout is None else block_timeout
    )
    while True:
        try:
            with transaction.atomic():
                _admit(row, 1)
                invocation = Invocation.objects.create(
                    **{**item, "args": args or [], "kwargs": kwargs or {}}
                )
            return _served(invocation, serving.of_queue(queue)), True
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


def _served(invocation: Invocation, found: serving.Serving, *, wake: bool = True):
    """A submit's answer says when nothing will run its queue (`hint`); a submit into an
    elastic queue with no live daemon wakes the controller once it commits."""
    invocation.hint = found.hint if invocation.state == Q_.QUEUED else ""
    if wake:
        serving.after_submit(found)
    return invocation


BATCH_SUBMIT_MAX = 10_000


def invocation_submit_batch(items: list[dict]) -> list[tuple[Invocation, bool]]:
    """Queue many invocations at once: all or none, in one INSERT of the whole batch.
    Each item is what invocation_submit takes. An item whose idempotency key is already
    used in its queue (or earlier in the batch) answers that invocation, created=False.
    Every queue must admit work, and a bounded queue must have room for all of its new
    items: a batch never blocks on a full queue. Answers in the order of `items`."""
    for item in items:
        _check_function(item["function"])
        item["queue"] = item.get("queue") or ""
    keyed = {(i["queue"], i["key"]) for i in items if i.get("key")}
    existing = _by_queue_and_key(keyed)
    fresh, seen = [], set(existing)
    for item in items:
        pair = (item["queue"], item.get("key") or "")
        if pair[1] and pair in seen:
            continue
        seen.add(pair)
        fresh.append(item)
    names = {item["queue"] for item in fresh}
    known = {q.name: q for q in Queue.objects.filter(name__in=names - {""})}
    queues = {name: _admitting_queue(name, known) for name in sorted(names)}
    with transaction.atomic():
        for name, queue in queues.items():
            _admit(queue, sum(1 for item in fresh if item["queue"] == name))
        inserted = submit.insert_queued(fresh)
        created_keys = {(row.queue, row.key): row.pk for row in inserted if row.key}
        unkeyed = iter(sorted(row.pk for row in inserted if not row.key))
        # a key taken by a concurrent submit between our look and our insert
        missing = {(i["queue"], i["key"]) for i in fresh if i.get("key")} - set(created_keys)
        existing.update(_by_queue_and_key(missing))
    rows = Invocation.objects.in_bulk(list(existing.values()))
    rows.update((row.pk, row) for row in inserted)
    found = serving.of_queues([row.queue for row in rows.values()])
    for row in rows.values():
        _served(row, found[row.queue], wake=False)
    for name in {row.queue for row in inserted}:
        serving.after_submit(found[name])
    answers, given = [], set()
    for item in items:
        pair = (item["queue"], item.get("key") or "")
        if pair[1]:
            pk = created_keys.get(pair) or existing[pair]
            new = pair in created_keys and pair not in given
            given.add(pair)
        else:
            pk, new = next(unkeyed), True
        answers.append((rows[pk], new))
    return answers


def _by_queue_and_key(pairs: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
    if not pairs:
        return {}
    queues, keys = zip(*pairs, strict=True)
    rows = Invocation.objects.filter(queue__in=set(queues), key__in=set(keys))
    return {(q, k): pk for pk, q, k in rows.values_list("id", "queue", "key") if (q, k) in pairs}


# ---------------------------------------------------------------------------- boltzmann levels
# A boltzmann queue's queued invocations by priority level: the claim (fleet/protocol.py)
# picks a level from them, and a queued invocation's position reads them.


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


def levels_for(queue: Queue, *, fresh: bool = False) -> dict[int, int]:
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


def levels_learnt(queue: Queue, levels: dict[int, int]) -> None:
    """What a claim learnt of a queue's levels (taken, or found empty), kept for the
    next claim in this process until the counts are due again."""
    with _levels_lock:
        if queue.pk in _levels_cache:
            _levels_cache[queue.pk] = (_levels_cache[queue.pk][0], levels)


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


# ---------------------------------------------------------------------------- kill / cancel


def invocation_get(invocation_id, *, fields: tuple[str, ...] = ()) -> Invocation:
    """The invocation, or NotFound. `fields`: only these columns (no daemon, no blobs),
    for a reader that polls."""
    rows = (
        Invocation.objects.only(*fields) if fields else Invocation.objects.select_related("daemon")
    )
    try:
        return rows.get(pk=int(invocation_id))
    except (Invocation.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"Invocation '{invocation_id}' does not exist.") from None


def invocation_kill(*, invocation_id, reason: str = "") -> Invocation:
    """Queued → killed at once. Running and finished ones are a Conflict that says why."""
    invocation = invocation_get(invocation_id)
    killed = kill.kill_queued(invocation_id=invocation.pk, reason=reason or "killed")
    invocation.refresh_from_db()
    if killed:
        audit.record(
            "job.kill",
            queue=invocation.queue,
            target=f"job {invocation.pk}",
            summary=f"killed {invocation.function}" + (f": {reason}" if reason else ""),
        )
        return invocation
    if invocation.state == Q_.RUNNING:
        raise Conflict(
            f"Invocation {invocation.pk} is running on daemon {invocation.daemon_id}: to stop "
            f"in-flight work, kill the process on the daemon ('lakeshore daemon exec "
            f"{invocation.daemon_id} kill {invocation.pk}') or drop the daemon "
            f"('lakeshore daemon remove {invocation.daemon_id}').",
            extra={"state": invocation.state, "worker": str(invocation.daemon_id)},
            code="invocation_running",
        )
    raise Conflict(
        f"Invocation {invocation.pk} already finished ({invocation.state}).",
        extra={"state": invocation.state},
        code="invocation_finished",
    )


def invocation_retry(*, invocation_id) -> Invocation:
    """Queue an ended invocation (failed, timeout or killed) again, as a NEW invocation
    linked to it (`retry_of`): the old one keeps its record (error, attempts, result),
    the new one starts from attempt 0 with the same function, arguments, priority, time
    limit and attempts, in the same queue, admitted like any submit (a full queue
    refuses at once). Once per invocation: retrying it again is a Conflict naming the
    retry (retry that one if it ends badly too), so a double click queues one."""
    invocation = invocation_get(invocation_id)
    with transaction.atomic():
        old = Invocation.objects.select_for_update().get(pk=invocation.pk)
        if not old.can_retry:  # jobs.models.RETRYABLE_STATES
            raise Conflict(
                f"Invocation {old.pk} is {old.state}: only a failed, timed-out or killed "
                "invocation can be retried.",
                extra={"state": old.state},
                code="invocation_not_retryable",
            )
        earlier = retried_as(old)
        if earlier is not None:
            raise Conflict(
                f"Invocation {old.pk} was already retried as {earlier}: retry that one "
                "if it ends badly too.",
                extra={"retry": str(earlier)},
                code="already_retried",
            )
        hooks.point("retry.before_insert")
        new, _ = invocation_submit(
            function=old.function,
            queue=old.queue,
            args=old.args,
            kwargs=old.kwargs,
            priority=old.priority,
            timeout_s=old.timeout_s,
            max_attempts=old.max_attempts,
            block_timeout=0,
            wire=old.wire,
            args_blob=old.args_blob,
            run_config=old.run_config,
        )
        Invocation.objects.filter(pk=new.pk).update(retry_of=old)
        new.retry_of = old
        audit.record(
            "job.retry",
            queue=old.queue,
            target=f"job {old.pk}",
            summary=f"retried {old.function} ({old.state}) as job {new.pk}",
            detail={"retry": new.pk},
        )
    return new


def retried_as(invocation: Invocation) -> int | None:
    """The id of the invocation that retries this one, if any (one indexed lookup)."""
    return invocation.retries.order_by("id").values_list("id", flat=True).first()


# ---------------------------------------------------------------------------- in bulk


SINCE_PATTERN = re.compile(r"^(\d{1,6})([smhd])$")
SINCE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
RETRY_BATCH = 500


def moment_since(text: str, *, now=None):
    """A bulk action's `since`: a span back from now (30m, 1h, 7d) or an ISO 8601 time."""
    found = SINCE_PATTERN.match(text)
    moment = None
    try:  # a span past the year 1, or a date that is none (month 13): no moment
        if found:
            amount, unit = found.groups()
            return (now or timezone.now()) - timedelta(**{SINCE_UNITS[unit]: int(amount)})
        moment = parse_datetime(text)
    except (OverflowError, ValueError):
        pass
    if moment is None:
        raise Invalid(
            f"since must be a span back from now (30m, 1h, 7d) or an ISO 8601 time, got {text!r}.",
            fields={"since": "a span (30m, 1h, 7d) or an ISO 8601 time"},
        )
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment, UTC)


def _known_queue(queue: str | None) -> None:
    if queue and not Queue.objects.filter(name=queue).exists():
        raise NotFound(f"Queue '{queue}' does not exist.", fields={"queue": "unknown"})


def _start_after(rows, search: str) -> int | None:
    """Where a bulk action's walk up the ids starts: below its oldest match when it holds
    a search (found fenced, so a walk never crosses the older rows none match), else at
    the start; None when a search matches nothing."""
    if not search:
        return 0
    with job_search.bounded(search):
        oldest = job_search.oldest_id(rows)
    return None if oldest is None else oldest - 1


def selection_text(*, states=(), queue=None, search="", since="") -> str:
    """A bulk action's filter as people read it (its audit event names it)."""
    parts = [f"state {', '.join(states)}"] if states else []
    if queue is not None:
        parts.append(f"queue {queue or '(default)'}")
    if search:
        parts.append(f"search {search!r}")
    if since:
        parts.append(f"since {since}")
    return "; ".join(parts) or "every queue"


def invocation_bulk_cancel(
    *,
    queue: str | None = None,
    search: str = "",
    since: str = "",
    reason: str = "",
    dry_run: bool = False,
    cap: int | None = None,
):
    """Cancel every queued invocation (of one queue, holding `search`, submitted `since`,
    if given), in batches. A dry run counts them: exactly, or with `cap` at most cap + 1
    (more than cap) for pages that count on every refresh."""
    _known_queue(queue)
    rows = Invocation.objects.filter(state=Q_.QUEUED)
    if queue is not None:
        rows = rows.filter(queue=queue)
    if search:
        rows = rows.matching(search)
    if since:
        rows = rows.filter(created_at__gte=moment_since(since))
    if dry_run:
        with job_search.bounded(search):
            return rows.count() if cap is None else rows.order_by().values("id")[: cap + 1].count()
    why = reason or "bulk-cancel"
    if search or since:  # the batches are found by the one rule of a search (models.py)
        cancelled, after = 0, _start_after(rows, search)
        while after is not None:
            with job_search.bounded(search):
                ids = list(
                    rows.filter(id__gt=after)
                    .order_by("id")
                    .values_list("id", flat=True)[: kill.BULK_BATCH]
                )
            if not ids:
                break
            with transaction.atomic():
                cancelled += kill.kill_queued_ids(ids=ids, reason=why)
            after = ids[-1]
    else:
        cancelled = kill.kill_queued_in_batches(queue=queue, reason=why)
    where = selection_text(queue=queue, search=search, since=since)
    audit.record(
        "jobs.bulk_cancel",
        queue=queue or "",
        target=where,
        summary=f"cancelled {cancelled} queued" + (f": {reason}" if reason else ""),
        detail={"queue": queue, "search": search, "since": since, "cancelled": cancelled},
    )
    return cancelled


def invocation_bulk_retry(
    *,
    states,
    queue: str | None = None,
    search: str = "",
    since: str = "",
    dry_run=False,
    cap: int | None = None,
) -> dict:
    """Retry every ended invocation in `states` (of one queue, holding `search`, ended
    `since`, if given) that was not retried yet, as invocation_retry does one: a new
    invocation linked to it. In batches of RETRY_BATCH, each locked, admitted like a
    batch submit, and committed before the next; a queue that refuses (full, drained)
    stops it, and the answer says how many were retried before. One audit event names
    the filter. A dry run counts the matches."""
    states = list(dict.fromkeys(states))
    wrong = [state for state in states if state not in RETRYABLE_STATES]
    if not states or wrong:
        raise Invalid(
            "state must be failed, timeout or killed (one or more)"
            + (f", got {', '.join(map(repr, wrong))}." if wrong else "."),
            fields={"state": "failed, timeout or killed"},
        )
    _known_queue(queue)
    rows = Invocation.objects.filter(state__in=states).exclude(
        Exists(Invocation.objects.filter(retry_of=OuterRef("pk")))
    )
    if queue is not None:
        rows = rows.filter(queue=queue)
    if search:
        rows = rows.matching(search)
    if since:
        rows = rows.filter(finished_at__gte=moment_since(since))
    where = selection_text(states=states, queue=queue, search=search, since=since)
    if dry_run:  # exactly, or with `cap` at most cap + 1, as a bulk-cancel's dry run
        with job_search.bounded(search):
            ids = rows.order_by().values("id")
            matched = ids.count() if cap is None else ids[: cap + 1].count()
        return {"matched": matched, "retried": 0, "dry_run": True, "filter": where}
    retried = 0
    try:
        after = _start_after(rows, search)
        while after is not None:
            with transaction.atomic():
                with job_search.bounded(search):
                    batch = list(
                        rows.filter(id__gt=after)
                        .order_by("id")
                        .select_for_update(of=("self",))
                        .values_list("id", "queue")[:RETRY_BATCH]
                    )
                if not batch:
                    break
                after = batch[-1][0]
                # a retry committed while this batch waited for its locks: skip those
                taken = set(
                    Invocation.objects.filter(retry_of__in=[i for i, _ in batch]).values_list(
                        "retry_of", flat=True
                    )
                )
                fresh = [(i, name) for i, name in batch if i not in taken]
                per_queue = Counter(name for _, name in fresh)
                known = {q.name: q for q in Queue.objects.filter(name__in=set(per_queue) - {""})}
                for name, count in sorted(per_queue.items()):
                    _admit(_admitting_queue(name, known), count)
                hooks.point("bulk_retry.before_insert")
                made = submit.insert_retries([i for i, _ in fresh])
                found = serving.of_queues(list(per_queue))
                for name in per_queue:
                    serving.after_submit(found[name])
            retried += len(made)
            if len(batch) < RETRY_BATCH:
                break
    except DomainError as refused:
        _record_bulk_retry(where, queue, retried)
        raise type(refused)(
            f"{refused.message} Retried {retried} before it stopped.",
            fields=refused.fields,
            extra={**refused.extra, "retried": retried},
            code=refused.code,
        ) from None
    _record_bulk_retry(where, queue, retried)
    return {"matched": retried, "retried": retried, "dry_run": False, "filter": where}


def _record_bulk_retry(where: str, queue: str | None, retried: int) -> None:
    if retried:
        audit.record(
            "jobs.bulk_retry",
            queue=queue or "",
            target=where,
            summary=f"retried {retried}: {where}",
            detail={"filter": where, "retried": retried},
        )


# ---------------------------------------------------------------------------- position


ETA_WINDOW_SECONDS = 600
ETA_SAMPLE = 5_000  # finishes read at most for a queue's pace


def queue_eta(invocation: Invocation, position: dict | None) -> dict | None:
    """When a queued invocation may start, from how many are ahead of it and how fast
    its queue finished work lately (kills aside: a bulk-cancel is no pace): over the
    last ETA_WINDOW_SECONDS, or over its last ETA_SAMPLE finishes if more came in that
    window (so a busy queue's page reads at most that many index entries). {"seconds",
    "rate_per_minute"}, or None when nothing finished lately (no rate to go by) or it
    is not queued."""
    if position is None:
        return None
    now = timezone.now()
    window = now - timedelta(seconds=ETA_WINDOW_SECONDS)
    recent = Invocation.objects.filter(queue=invocation.queue, finished_at__gte=window)
    recent = recent.exclude(state=Q_.KILLED).order_by("-finished_at")  # as inv_finished
    oldest_of_sample = recent.values_list("finished_at", flat=True)[ETA_SAMPLE - 1 : ETA_SAMPLE]
    if oldest_of_sample:
        span = max((now - oldest_of_sample[0]).total_seconds(), 0.001)
        rate = ETA_SAMPLE / span  # per second, over the newest ETA_SAMPLE
    else:
        done = recent.count()  # fewer than ETA_SAMPLE: exact, and cheap
        if not done:
            return None
        rate = done / ETA_WINDOW_SECONDS
    return {"seconds": round((position["ahead"] + 1) / rate), "rate_per_minute": rate * 60}


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
        levels = levels_for(queue)  # counted at most every LEVELS_TTL s: no scan per request
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
