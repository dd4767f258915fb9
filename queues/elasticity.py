"""The elasticity rules, in one place: which parameters each kind takes, how many
daemons a queue wants for the signals a tick sees (SPEC "elasticity"), and the plan:
what the controller's next tick would do for a queue (fleet/controller.py carries it
out; `stats`, `patch --dry-run`, /metrics and the charts show it)."""

import math
from dataclasses import dataclass
from datetime import timedelta
from fractions import Fraction

from django.conf import settings
from django.db import connection
from django.utils import timezone

from queues.models import ElasticityKind, EventAction, Queue, QueueState

# kind -> (parameters it uses, parameters it requires, defaults)
PARAMETERS: dict[str, tuple[set[str], set[str], dict]] = {
    ElasticityKind.FIXED: ({"min"}, {"min"}, {}),
    ElasticityKind.FULLY_ELASTIC: ({"min", "max"}, set(), {"min": 0}),
    ElasticityKind.POOL_WITH_THRESHOLD: ({"min", "max", "threshold"}, {"threshold"}, {"min": 0}),
    ElasticityKind.MAX_COUNT: ({"max"}, {"max"}, {}),
}
ALL_PARAMETERS = ("min", "max", "threshold")
CLI_SPELLING = {kind.value: kind.value.replace("_", "-") for kind in ElasticityKind}
API_SPELLING = {hyphen: underscore for underscore, hyphen in CLI_SPELLING.items()}


def wrong_spelling_message(value: str) -> str | None:
    """The API and lakeshore.yaml take underscores; the CLI flag takes hyphens."""
    if value in API_SPELLING and value not in CLI_SPELLING:
        return (
            f"'{value}' is the CLI flag's spelling; the API and lakeshore.yaml take "
            f"'{API_SPELLING[value]}'."
        )
    return None


def normalise(kind: str, params: dict) -> tuple[dict, dict[str, str]]:
    """Check `params` (min, max, threshold; None = not set) against `kind`.
    Returns the stored values (defaults filled, unused ones None) and errors by field."""
    uses, requires, defaults = PARAMETERS[kind]
    errors: dict[str, str] = {}
    values = {name: params.get(name) for name in ALL_PARAMETERS}
    for name in ALL_PARAMETERS:
        if values[name] is not None and name not in uses:
            errors[name] = (
                f"{CLI_SPELLING[kind]} elasticity does not use {name}; it takes "
                f"{', '.join(sorted(uses))}."
            )
    for name in requires:
        if values[name] is None:
            errors.setdefault(name, f"{CLI_SPELLING[kind]} elasticity needs {name}.")
    for name, default in defaults.items():
        if values[name] is None:
            values[name] = default
    low, high, threshold = values["min"], values["max"], values["threshold"]
    if low is not None and low < 0:
        errors.setdefault("min", "min must be 0 or more.")
    if high is not None and high < 1:
        errors.setdefault("max", "max must be at least 1.")
    if low is not None and high is not None and low > high and "min" not in errors:
        errors["min"] = f"min ({low}) must not exceed max ({high})."
    if threshold is not None and not (0 < threshold <= 1):
        errors.setdefault("threshold", "threshold must be in (0, 1]: above 0.0, at most 1.0.")
    return values, errors


@dataclass(frozen=True)
class Signals:
    daemons: int  # D: live daemons (provisioning, idle, busy)
    busy: int  # B
    pending: int  # P: queued invocations

    @property
    def utilization(self) -> float:
        return self.busy / self.daemons if self.daemons else 0.0


def desired_count(kind: str, params: dict, signals: Signals, *, cap: int) -> int:
    """How many daemons the queue wants now (before the scale-down window)."""
    low = params.get("min") or 0
    high = params.get("max")
    high = cap if high is None else min(high, cap)
    work = signals.busy + signals.pending
    if kind == ElasticityKind.FIXED:
        wanted = low
    elif kind == ElasticityKind.FULLY_ELASTIC:
        wanted = work
    elif kind == ElasticityKind.POOL_WITH_THRESHOLD:
        # Exact decimal arithmetic: 21 / 0.7 is 30, not 30.000000000000004 → 31.
        wanted = math.ceil(Fraction(work) / Fraction(str(params["threshold"])))
    elif kind == ElasticityKind.MAX_COUNT:
        return min(work, high)
    else:  # pragma: no cover - the model's choices forbid it
        raise ValueError(kind)
    return max(low, min(wanted, high)) if kind != ElasticityKind.FIXED else min(low, cap)


# ---------------------------------------------------------------------------- the plan

BACKOFF_MAX_SECONDS = 600


def backoff_seconds(failures: int) -> float:
    """How long a queue waits after `failures` failed launches (or ticks) in a row."""
    return min(settings.LAKESHORE_TICK_SECONDS * 2**failures, BACKOFF_MAX_SECONDS)


@dataclass(frozen=True)
class Plan:
    wanted: int  # what the formula asks for now
    desired: int  # what the controller moves toward (after the scale-down window)
    delta: int  # launches (+) or terminations (−) the next tick would try
    action: str  # launch | terminate | hold | backoff | none
    why: str  # the human reason, for the event
    note: str = ""  # why nothing happens, when that is not obvious (for `stats`)

    @property
    def next_action(self) -> str:
        if self.action == "launch":
            return f"launch {self.delta}"
        if self.action == "terminate":
            return f"terminate up to {-self.delta} idle"
        if self.action in ("hold", "backoff"):
            return f"{self.action} ({self.why})"
        return f"none ({self.note})" if self.note else "none"


# The events a tick writes with what its formula wanted (an event found outside a tick, a
# daemon lost say, carries no `wanted`).
_TICK_ACTIONS = [
    str(action)
    for action in (
        EventAction.TICK_NOOP,
        EventAction.SCALE_UP,
        EventAction.SCALE_DOWN,
        EventAction.HOLD,
        EventAction.LAUNCH_FAILED,
    )
]

# The highest `wanted` of the window, per queue: the events inside it, and the wanted
# still in force when it began (the latest tick event at or before its start; a tick
# whose decision did not change writes no event, so that value held until the next one).
_PEAKS_SQL = """
SELECT q.id, GREATEST(
         (SELECT max(e.wanted) FROM queues_queueevent e
           WHERE e.queue_id = q.id AND e.at > %(since)s),
         (SELECT e.wanted FROM queues_queueevent e
           WHERE %(in_force)s AND e.queue_id = q.id AND e.at <= %(since)s
             AND e.action = ANY(%(actions)s)
           ORDER BY e.at DESC, e.id DESC LIMIT 1))
  FROM unnest(%(ids)s::bigint[]) AS q(id)
"""


def window_peaks(queue_ids: list[int], *, now) -> dict[int, int | None]:
    """The highest count each queue wanted in the last LAKESHORE_SCALE_DOWN_WINDOW
    seconds (None: no event says), for all of them in one statement. A window of 0
    holds nothing: the value in force at its start is the one this tick replaces."""
    if not queue_ids:
        return {}
    window = timedelta(seconds=settings.LAKESHORE_SCALE_DOWN_WINDOW)
    params = {
        "ids": list(queue_ids),
        "since": now - window,
        "in_force": window.total_seconds() > 0,
        "actions": _TICK_ACTIONS,
    }
    with connection.cursor() as cursor:
        cursor.execute(_PEAKS_SQL, params)
        return dict(cursor.fetchall())


def _signals_text(s: Signals) -> str:
    return f"D={s.daemons} B={s.busy} P={s.pending} U={s.utilization:.2f}"


def plan(queue: Queue, signals: Signals, *, now=None, peaks: dict | None = None) -> Plan:
    """What the next tick would do, without doing it (also `stats` and `patch --dry-run`).
    `peaks`: window_peaks read for many queues at once (the controller's tick); without
    it, this queue's is read when the decision needs it."""
    now = now or timezone.now()
    d = signals.daemons
    if queue.state == QueueState.ARCHIVED:
        step = max(-d, -settings.LAKESHORE_MAX_TERMINATE_PER_TICK)
        why = "archived: scale to zero"
        return Plan(0, 0, step, "terminate" if d else "none", why, note="archived")
    if not queue.elasticity_kind:
        return Plan(d, d, 0, "none", "no elasticity declared", note="no elasticity declared")
    if queue.state == QueueState.PAUSED:
        return Plan(d, d, 0, "hold", "paused: holding the pool's size")
    params = {
        "min": queue.elasticity_min,
        "max": queue.elasticity_max,
        "threshold": queue.elasticity_threshold,
    }
    cap = settings.LAKESHORE_MAX_DAEMONS_PER_QUEUE
    wanted = desired_count(queue.elasticity_kind, params, signals, cap=cap)
    why = f"{_signals_text(signals)}: {queue.elasticity_kind} wants {wanted}"
    if queue.state == QueueState.DRAINING and signals.busy + signals.pending == 0:
        wanted, why = 0, "draining and nothing left: scale to zero"
    desired = wanted
    if wanted < d and queue.state != QueueState.DRAINING:
        window = timedelta(seconds=settings.LAKESHORE_SCALE_DOWN_WINDOW)
        if peaks is None:
            peaks = window_peaks([queue.pk], now=now) if queue.pk else {}
        peak = peaks.get(queue.pk)
        if peak is not None and peak > wanted:
            desired = min(peak, d)
            why += f"; holding {desired} for the scale-down window ({window.seconds} s)"
    delta = desired - d
    if delta > 0:
        delta = min(delta, settings.LAKESHORE_MAX_LAUNCH_PER_TICK)
        if not queue.provider_id:
            note = f"wants {delta} more daemon(s) but has no provider"
            return Plan(wanted, desired, 0, "none", f"{why}; {note}", note=note)
        if queue.launch_backoff_until and queue.launch_backoff_until > now:
            until = queue.launch_backoff_until.strftime("%H:%M:%S")
            return Plan(
                wanted,
                desired,
                0,
                "backoff",
                f"{queue.launch_failures} failed launch(es) in a row; next try at {until} UTC",
            )
        return Plan(wanted, desired, delta, "launch", why + f" → launching {delta}")
    if delta < 0:
        delta = max(delta, -settings.LAKESHORE_MAX_TERMINATE_PER_TICK)
        return Plan(wanted, desired, delta, "terminate", why + f" → terminating {-delta}")
    return Plan(wanted, desired, 0, "none", why)
