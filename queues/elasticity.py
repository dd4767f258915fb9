"""The elasticity rules, in one place: which parameters each kind takes, and how many
daemons a queue wants for the signals a tick sees (SPEC "elasticity")."""

import math
from dataclasses import dataclass
from fractions import Fraction

from queues.models import ElasticityKind

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
