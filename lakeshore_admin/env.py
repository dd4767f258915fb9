"""Small readers of the environment. A bad value raises BadSetting, whose message is one
line naming the variable, the value and what is expected; a process that does not catch
it prints that line alone (no traceback) and exits with status 1 (see `_excepthook`).
This module imports no Django settings: gunicorn's configuration reads through it too."""

import os
import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
# A unit for numbers, from the variable's name (LAKESHORE_TICK_SECONDS: seconds).
_UNITS = {"_BYTES": "bytes", "_DAYS": "days", "_MINUTES": "minutes"}
_UNITS.update(
    dict.fromkeys(
        ("_SECONDS", "_TIMEOUT", "_WINDOW", "_GRACE", "_RETENTION", "_BACKOFF", "_BACKOFF_MAX"),
        "seconds",
    )
)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class BadSetting(ImproperlyConfigured):
    """An unusable value in the environment: str() is the whole message, one line."""

    def __init__(self, name: str, raw: str, expected: str):
        super().__init__(f"{name}={raw!r}: expected {expected}")
        self.name = name


def _excepthook(kind, value, traceback, previous=sys.excepthook):
    if isinstance(value, BadSetting):
        print(value, file=sys.stderr, flush=True)
        return
    previous(kind, value, traceback)


# Every process that reads settings (manage.py, gunicorn, Celery, make run) imports this
# module first; a BadSetting nobody catches ends the process with its line alone.
sys.excepthook = _excepthook


def _raw(name: str) -> str | None:
    return os.environ.get(name)


def env_str(name: str, default: str = "") -> str:
    raw = _raw(name)
    return default if raw is None else raw


REPOSITORY = Path(__file__).resolve().parent.parent


def var_dir() -> Path:
    """Where the server keeps what it writes (the secret key, the embedded database, logs,
    make run's credentials): LAKESHORE_VAR_DIR, else var/ in the checkout."""
    return Path(env_str("LAKESHORE_VAR_DIR", str(REPOSITORY / "var")))


def access_log() -> str:
    """Where the web server writes its line per request: LAKESHORE_ACCESS_LOG, else
    var/log/access.log; "-" is the terminal (standard output)."""
    return env_str("LAKESHORE_ACCESS_LOG", str(var_dir() / "log" / "access.log"))


def env_bool(name: str, default: bool = False) -> bool:
    raw = _raw(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise BadSetting(name, raw, "1 or 0 (also true/false, yes/no, on/off)")


def _unit(name: str, unit: str | None) -> str:
    if unit is None:
        unit = next((u for suffix, u in _UNITS.items() if name.endswith(suffix)), "")
    return f" of {unit}" if unit else ""


def env_number(
    name: str,
    default: float,
    *,
    minimum: float,
    maximum: float | None = None,
    kind: type = int,
    unit: str | None = None,
) -> float:
    """A number from the environment (empty or unset: the default). `unit` names what it
    counts in the error (by default from the name: _SECONDS, _BYTES, _DAYS, _MINUTES)."""
    raw = _raw(name)
    if raw is None or raw.strip() == "":
        return default
    what = "a whole number" if kind is int else "a number"
    bounds = f"at least {minimum:g}" if maximum is None else f"from {minimum:g} to {maximum:g}"
    expected = f"{what}{_unit(name, unit)}, {bounds}"
    try:
        value = kind(raw.strip())
    except ValueError:
        raise BadSetting(name, raw, expected) from None
    if value != value or value in (float("inf"), float("-inf")):  # nan, inf
        raise BadSetting(name, raw, expected)
    if value < minimum or (maximum is not None and value > maximum):
        raise BadSetting(name, raw, expected)
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = _raw(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def log_level(name: str, raw: str, default: str) -> str:
    """`raw`, the value of `name` (read with env_str), as a logging level name; empty:
    `default`."""
    if not raw.strip():
        return default
    if raw.strip().upper() not in LOG_LEVELS:
        raise BadSetting(name, raw, "a log level: " + ", ".join(LOG_LEVELS))
    return raw.strip().upper()
