"""Writes on queues and their events, and the queues' signals and stats. The API, the
console, admin actions and tasks all call these; the rules live here once (STYLE: one
rule, one place). Providers and daemons: fleet/services.py."""

import json

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Func, Value
from django.utils import timezone

from accounts import audit
from fleet.models import LIVE_DAEMON_STATES, Daemon, DaemonState, Provider
from jobs import insight
from jobs.models import Invocation, InvocationState
from jobs.transitions import kill
from lakeshore_admin import hooks, metrics
from lakeshore_admin.errors import Conflict, Invalid, NotFound
from lakeshore_admin.names import DEFAULT_QUEUE_LABEL
from queues import elasticity
from queues.models import Queue, QueueEvent, QueueKind, QueueState

# ---------------------------------------------------------------------------- lookups


# The default queue ('') has no row and no name; where an address needs one, it is
# "(default)" (lakeshore_admin/names.py).
DEFAULT_LABEL = DEFAULT_QUEUE_LABEL


def default_queue() -> Queue:
    """The default queue as a Queue that is never saved: always active, fifo, with no
    provider and no elasticity, so the controller never acts on it and it has no events."""
    return Queue(
        name="",
        kind=QueueKind.FIFO,
        state=QueueState.ACTIVE,
        description="The default queue: jobs submitted without --queue; served by daemons "
        "run without --queues.",
    )


def queue_read(name: str) -> Queue:
    """A queue to read (its stats, its events): by name, or the default queue for ''
    or DEFAULT_LABEL."""
    if name in ("", DEFAULT_LABEL):
        return default_queue()
    return queue_get(name)


def queue_get(name: str, *, for_update: bool = False) -> Queue:
    manager = Queue.objects.select_for_update(of=("self",)) if for_update else Queue.objects
    try:
        return manager.select_related("provider").get(name=name)
    except Queue.DoesNotExist:
        raise NotFound(f"Queue '{name}' does not exist.") from None


def queue_event(
    queue: Queue,
    *,
    action: str,
    reason: str,
    delta: int,
    now=None,
    signals=None,
    desired: int | None = None,
    wanted: int = 0,
) -> QueueEvent:
    """A queue's event (QueueEvent), not yet saved: a tick's decision (with the signals
    it saw and what its formula wanted), or something found outside one (a failed
    launch after commit, a daemon its provider lost: the queue's signals now)."""
    if signals is None:
        signals = queue_signals(queue)["signals"]
    return QueueEvent(
        queue=queue,
        at=now or timezone.now(),
        action=action,
        reason=reason[:500],
        daemons=signals.daemons,
        busy=signals.busy,
        pending=signals.pending,
        utilization=round(signals.utilization, 4),
        desired=signals.daemons if desired is None else desired,
        wanted=wanted,
        delta=delta,
    )


def queue_events_save(events: list[QueueEvent]) -> None:
    """The one writer of queues' events, in one INSERT however many; each is counted in
    /metrics once the transaction commits."""
    QueueEvent.objects.bulk_create(events)
    for event in events:
        metrics.controller_acted(event)


def queue_event_now(queue: Queue, **fields) -> QueueEvent:
    """queue_event, saved now."""
    event = queue_event(queue, **fields)
    queue_events_save([event])
    return event


def _provider_for(name: str | None, *, field: str = "provider") -> Provider | None:
    """'' or None clears; an unknown name is refused."""
    if not name:
        return None
    try:
        return Provider.objects.get(name=name)
    except Provider.DoesNotExist:
        known = ", ".join(Provider.objects.values_list("name", flat=True)[:20]) or "none yet"
        raise Invalid(
            f"Unknown provider '{name}' (known: {known}). Add it with "
            f"'lakeshore providers add {name} --kind simulated' (or --kind local).",
            fields={field: f"unknown provider '{name}'"},
        ) from None


def name_list(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# ---------------------------------------------------------------------------- queues


def _apply_elasticity(queue: Queue, kind: str, params: dict) -> None:
    values, errors = elasticity.normalise(kind, params)
    if errors:
        message = "; ".join(f"{name}: {msg}" for name, msg in errors.items())
        raise Invalid(
            f"Invalid elasticity: {message}",
            fields={f"elasticity.{name}": msg for name, msg in errors.items()},
        )
    queue.elasticity_kind = kind
    queue.elasticity_min = values["min"]
    queue.elasticity_max = values["max"]
    queue.elasticity_threshold = values["threshold"]


def _check_temperature(queue: Queue) -> None:
    if queue.kind != QueueKind.BOLTZMANN and queue.temperature != 1.0:
        raise Invalid(
            "temperature applies to boltzmann queues only.",
            fields={"temperature": f"a {queue.kind} queue has no temperature"},
        )


def queue_create(
    *,
    name: str,
    kind: str = QueueKind.FIFO,
    description: str = "",
    provider: str | None = None,
    elasticity_spec: dict | None = None,
    instance_type: str = "",
    image_id: str = "",
    runner: str = "",
    max_depth: int | None = None,
    on_full: str = "reject",
    temperature: float = 1.0,
) -> Queue:
    if Queue.objects.filter(name=name).exists():
        raise Conflict(
            f"Queue '{name}' already exists.",
            fields={"name": "already exists"},
            code="already_exists",
        )
    queue = Queue(
        name=name,
        kind=kind,
        description=description,
        provider=_provider_for(provider),
        instance_type=instance_type,
        image_id=image_id,
        runner=runner,
        max_depth=max_depth,
        on_full=on_full,
        temperature=temperature,
    )
    if elasticity_spec:
        spec = dict(elasticity_spec)
        _apply_elasticity(queue, spec.pop("kind"), spec)
    _check_temperature(queue)
    try:
        with transaction.atomic():
            queue.save()
    except IntegrityError:
        raise Conflict(
            f"Queue '{name}' already exists.",
            fields={"name": "already exists"},
            code="already_exists",
        ) from None
    audit.record("queue.create", queue=name, target=f"queue {name}", summary=f"kind {kind}")
    return queue


IMMUTABLE_ON_PATCH = {
    "name": "A queue's name cannot change: add a new queue and remove this one.",
    "kind": "A queue's kind is immutable: add a new queue with the kind you want.",
    "state": "Change the state with drain, pause, resume, archive or unarchive.",
}


def queue_patch(*, name: str, changes: dict, dry_run: bool = False) -> Queue:
    """Apply `changes` (description, provider, elasticity {min,max,threshold},
    max_depth, on_full, temperature, instance_type, image_id, runner).
    With dry_run nothing is saved; the returned queue shows the result."""
    for field, message in IMMUTABLE_ON_PATCH.items():
        if field in changes:
            raise Invalid(message, fields={field: "immutable"})
    with transaction.atomic():
        queue = queue_get(name, for_update=True)
        changes = dict(changes)
        if "provider" in changes:
            queue.provider = _provider_for(changes.pop("provider"))
        numbers = changes.pop("elasticity", None)
        if numbers:
            if "kind" in numbers:
                raise Invalid(
                    "The elasticity kind is immutable; only min, max and threshold can be "
                    "patched. Add a new queue for another kind.",
                    fields={"elasticity.kind": "immutable"},
                )
            if not queue.elasticity_kind:
                raise Invalid(
                    f"Queue '{name}' has no elasticity declaration, so min, max and "
                    "threshold do not apply. Add a queue with --elasticity to scale it.",
                    fields={f"elasticity.{key}": "no elasticity declared" for key in numbers},
                )
            current = {
                "min": queue.elasticity_min,
                "max": queue.elasticity_max,
                "threshold": queue.elasticity_threshold,
            }
            current.update(numbers)
            _apply_elasticity(queue, queue.elasticity_kind, current)
        for field, value in changes.items():
            setattr(queue, field, value)
        _check_temperature(queue)
        if not dry_run:
            queue.save()
            shown = {**changes, **({"elasticity": numbers} if numbers else {})}
            if "provider" in shown or queue.provider_id:
                shown.setdefault("provider", queue.provider.name if queue.provider else None)
            audit.record(
                "queue.patch",
                queue=name,
                target=f"queue {name}",
                summary="changed " + ", ".join(sorted(shown)) if shown else "no change",
                detail=_json_safe(shown),
            )
    return queue


def _json_safe(value):
    """Values as an audit row stores them (numbers, strings, lists, dicts)."""

    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


# action -> (states it may start from, state it leads to)
TRANSITIONS: dict[str, tuple[set[str], str]] = {
    "drain": ({QueueState.ACTIVE, QueueState.PAUSED, QueueState.DRAINING}, QueueState.DRAINING),
    "pause": ({QueueState.ACTIVE, QueueState.PAUSED}, QueueState.PAUSED),
    "resume": (set(QueueState.values), QueueState.ACTIVE),
    "unarchive": (set(QueueState.values), QueueState.ACTIVE),
    "archive": (set(QueueState.values), QueueState.ARCHIVED),
}


# What each state change asks before it is made (the console's confirmations).
CONFIRMATIONS = {
    "drain": "stop admitting new work; what is queued and running still finishes",
    "archive": "soft-delete: no more work is admitted or dispatched",
}


def queue_actions(queue: Queue) -> list[dict]:
    """The state changes that would change this queue now (a repeat, harmless as it is,
    is not offered), each with its confirmation if it is destructive."""
    return [
        {"action": action, "confirm": CONFIRMATIONS.get(action, "")}
        for action, (allowed, target) in TRANSITIONS.items()
        if queue.state in allowed and queue.state != target
    ]


def queue_transition(*, name: str, action: str) -> Queue:
    """drain, pause, resume, unarchive, archive. Repeating one is harmless; a move the
    current state forbids is a Conflict that says what to do instead."""
    allowed, target = TRANSITIONS[action]
    updated = Queue.objects.filter(name=name, state__in=allowed).update(
        state=target, updated_at=timezone.now()
    )
    queue = queue_get(name)
    if not updated:
        hint = {
            QueueState.ARCHIVED: f"unarchive it first ('lakeshore queues unarchive {name}')",
            QueueState.DRAINING: f"resume it first ('lakeshore queues resume {name}')",
        }.get(queue.state, "")
        raise Conflict(
            f"Cannot {action} queue '{name}': it is {queue.state}"
            + (f"; {hint}." if hint else "."),
            extra={"state": queue.state},
            code="queue_state",
        )
    audit.record(f"queue.{action}", queue=name, target=f"queue {name}", summary=f"now {target}")
    return queue


def queue_delete(*, name: str, force: bool = False) -> dict:
    """Remove a queue. Refused while live daemons are bound to it or invocations are
    queued (unless force) or running (always: drain it first). Force scrubs the name
    from every daemon's `queues` and kills its queued invocations, in one transaction."""
    with transaction.atomic():
        queue = queue_get(name, for_update=True)
        bound = list(
            Daemon.objects.live().subscribed_to(name).order_by("id").values_list("name", "id")
        )
        running = Invocation.objects.filter(queue=name, state=InvocationState.RUNNING).exists()
        if running:
            raise Conflict(
                f"Queue '{name}' has running invocations: drain it and wait "
                f"('lakeshore queues drain {name} --wait'), then remove it.",
                extra={"running": True},
                code="queue_in_use",
            )
        queued = Invocation.objects.filter(queue=name, state=InvocationState.QUEUED)
        if not force:
            if bound:
                labels = [f"{dname} ({did})" for dname, did in bound]
                raise Conflict(
                    f"Queue '{name}' still has {len(bound)} bound daemon(s): "
                    f"{name_list(labels)}. Remove them or use --force to unbind them.",
                    extra={"daemons": [str(did) for _, did in bound][:100]},
                    code="queue_in_use",
                )
            if queued.exists():
                raise Conflict(
                    f"Queue '{name}' has queued invocations; 'lakeshore jobs bulk-cancel "
                    f"--queue {name}' cancels them, or --force kills them.",
                    code="queue_in_use",
                )
        now = timezone.now()
        killed = kill.kill_queued_of_queue(queue=name, reason="queue removed")
        # A daemon left with no queue would silently start serving the default queue:
        # drain it instead (it finishes and stops).
        Daemon.objects.live().filter(queues=[name]).update(
            state=DaemonState.DRAINING, updated_at=now
        )
        unbound = Daemon.objects.subscribed_to(name).update(
            queues=Func(F("queues"), Value(name), function="array_remove"), updated_at=now
        )
        queue.delete()
        hooks.point("queue_remove.before_commit")
        audit.record(
            "queue.remove",
            queue=name,
            target=f"queue {name}",
            summary=f"removed{' (--force)' if force else ''}: {killed} queued killed, "
            f"{unbound} daemon(s) unbound",
        )
    return {"name": name, "deleted": True, "unbound_daemons": unbound, "killed": killed}


# ---------------------------------------------------------------------------- signals


PENDING_CAP = 10_000  # no unbounded COUNT(*) over invocations on a request path


def _capped_count(queryset, cap: int = PENDING_CAP) -> int:
    return queryset.order_by().values("id")[: cap + 1].count()


def queue_signals(queue: Queue) -> dict:
    """What the controller looks at for this queue, now; or, for a queue the tick read
    with many others at once (fleet/controller.py), what that read found."""
    read = getattr(queue, "signals_read", None)
    if read is not None:
        return read
    rows = (
        Daemon.objects.live()
        .serving(queue.name)
        .order_by()
        .values_list("state")
        .annotate(n=Count("id"))
    )
    of_queue = Invocation.objects.filter(queue=queue.name)
    pending = _capped_count(of_queue.filter(state=InvocationState.QUEUED))
    running = _capped_count(of_queue.filter(state=InvocationState.RUNNING))
    return signals_from(dict(rows), pending=pending, running=running)


def signals_from(live: dict[str, int], *, pending: int, running: int) -> dict:
    """queue_signals' answer from its counts: live daemons by state, queued (capped),
    running (capped). queues/pressure.py counts them for many queues at once."""
    counts = {state: live.get(state, 0) for state in LIVE_DAEMON_STATES}
    working = counts[DaemonState.PROVISIONING] + counts[DaemonState.IDLE] + counts[DaemonState.BUSY]
    return {
        "signals": elasticity.Signals(
            daemons=working, busy=counts[DaemonState.BUSY], pending=pending
        ),
        "idle": counts[DaemonState.IDLE],
        "provisioning": counts[DaemonState.PROVISIONING],
        "draining": counts[DaemonState.DRAINING],
        "running": running,
        "pending_capped": pending > PENDING_CAP,
    }


def stats_window(name: str | None) -> insight.Window:
    """The window a stats answer covers: 1h (the default) or 24h."""
    if name not in (None, "", *insight.WINDOWS):
        choices = ", ".join(insight.WINDOWS)
        raise Invalid(
            f"window must be one of {choices}, got {name!r}.",
            fields={"window": f"one of {choices}"},
        )
    return insight.window(name)


def queue_stats(queue: Queue, span: insight.Window | None = None, *, ended=True) -> dict:
    """What the controller sees now and would do next, and (unless `ended` is False:
    the console's summary, which shows it apart) what ended in the window."""
    span = span or insight.window(None)
    seen = queue_signals(queue)
    signals: elasticity.Signals = seen["signals"]
    plan = elasticity.plan(queue, signals)
    recent = (
        [] if queue.pk is None else list(QueueEvent.objects.filter(queue=queue).decisions()[:5])
    )
    return {
        "queue": queue.name,
        "state": queue.state,
        **_live_figures(seen),
        "desired": plan.desired,
        "next_action": plan.next_action,
        "recent_actions": recent,
        **({span.block: insight.ended(queue=queue.name, span=span)} if ended else {}),
    }


def _live_figures(seen: dict) -> dict:
    """What a stats answer says of daemons and work now, from queue_signals' answer."""
    signals: elasticity.Signals = seen["signals"]
    return {
        "daemons": signals.daemons,
        "busy": signals.busy,
        "idle": seen["idle"],
        "provisioning": seen["provisioning"],
        "draining": seen["draining"],
        "utilization": round(signals.utilization, 4),
        "pending": signals.pending,
        "pending_capped": seen["pending_capped"],
        "running": seen["running"],
    }


def fleet_stats(span: insight.Window | None = None, *, ended=True) -> dict:
    """queue_stats over every queue: live daemons by state (each daemon once, whatever
    queues it serves), what waits and runs (capped), and (unless `ended` is False) what
    ended in the window."""
    span = span or insight.window(None)
    live = dict(Daemon.objects.live().order_by().values_list("state").annotate(n=Count("id")))
    pending = _capped_count(Invocation.objects.filter(state=InvocationState.QUEUED))
    running = _capped_count(Invocation.objects.filter(state=InvocationState.RUNNING))
    seen = signals_from(live, pending=pending, running=running)
    return {
        "queues": Queue.objects.exclude(state=QueueState.ARCHIVED).count(),
        **_live_figures(seen),
        "running_capped": seen["running"] > PENDING_CAP,
        **({span.block: insight.ended(queue=None, span=span)} if ended else {}),
    }
