"""What a provider's `config` may hold, per kind: the keys its driver reads
(queues/drivers.py), their types and ranges, and which are required. A key not in its
kind's schema is refused, so a config cannot carry settings no driver reads — least of
all the modules daemons may run, which come only from the server's own settings.

`config_errors(kind, config)` returns {"config.KEY": "what is wrong"}, empty when the
config is good; queues/services.py turns that into the API's error."""

import math
from collections.abc import Callable
from dataclasses import dataclass

from queues.models import Provider

MAX_STARTUP_SECONDS = 86_400  # a day: timedelta and the tick both stay sane
MAX_LOCAL_CONCURRENCY = 64
MAX_TEXT = 500


def _number(minimum: float, maximum: float) -> Callable[[object], str | None]:
    def check(value) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number ≥ {minimum:g}"
        if not math.isfinite(value) or value < minimum:
            return f"must be a number ≥ {minimum:g}"
        if value > maximum:
            return f"must be at most {maximum:g}"
        return None

    return check


def _whole(minimum: int, maximum: int) -> Callable[[object], str | None]:
    def check(value) -> str | None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not (minimum <= value <= maximum)
        ):
            return f"must be a whole number from {minimum} to {maximum}"
        return None

    return check


def _text(*, allow_blank: bool) -> Callable[[object], str | None]:
    def check(value) -> str | None:
        if not isinstance(value, str) or (not allow_blank and not value.strip()):
            return "must be a string" if allow_blank else "must be a non-empty string"
        if len(value) > MAX_TEXT:
            return f"must be at most {MAX_TEXT} characters"
        return None

    return check


@dataclass(frozen=True)
class Key:
    check: Callable[[object], str | None]
    meaning: str
    required: bool = False


CREDENTIAL_REF = Key(
    _text(allow_blank=False), "where this provider's credentials live (never the credentials)"
)

SCHEMAS: dict[str, dict[str, Key]] = {
    Provider.Kind.SIMULATED: {
        "startup_seconds": Key(
            _number(0, MAX_STARTUP_SECONDS),
            "seconds a launched daemon stays provisioning (default 0)",
        ),
        "fail": Key(_text(allow_blank=True), "every launch fails with this message (a test aid)"),
        "credential_ref": CREDENTIAL_REF,
    },
    Provider.Kind.LOCAL: {
        "concurrency": Key(
            _whole(1, MAX_LOCAL_CONCURRENCY),
            f"jobs each daemon runs at once, 1 to {MAX_LOCAL_CONCURRENCY} (default 1)",
        ),
        "credential_ref": CREDENTIAL_REF,
    },
}


def allowed_keys(kind: str) -> list[str]:
    return sorted(SCHEMAS.get(kind, {}))


def config_errors(kind: str, config: dict) -> dict[str, str]:
    """{"config.KEY": message} for every key that is unknown, missing or wrong."""
    schema = SCHEMAS[kind]
    allowed = ", ".join(allowed_keys(kind)) or "none"
    errors = {}
    for key, value in config.items():
        spec = schema.get(str(key))
        if spec is None:
            errors[f"config.{key}"] = f"unknown key (allowed: {allowed})"
        elif (problem := spec.check(value)) is not None:
            errors[f"config.{key}"] = problem
    for key, spec in schema.items():
        if spec.required and key not in config:
            errors[f"config.{key}"] = "required"
    return errors
