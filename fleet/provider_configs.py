"""What a provider's `config` may hold, per kind: the keys its driver reads
(fleet/drivers.py), their types and ranges, and which are required. A key not in its
kind's schema is refused, so a config cannot carry settings no driver reads — least of
all the modules daemons may run, which come only from the server's own settings.

`config_errors(kind, config)` returns {"config.KEY": "what is wrong"}, empty when the
config is good; queues/services.py turns that into the API's error."""

import math
import os
import pwd
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from fleet.models import Provider

MAX_STARTUP_SECONDS = 86_400  # a day: timedelta and the tick both stay sane
MAX_LOCAL_CONCURRENCY = 64
MAX_TEXT = 500
MAX_ENVIRONMENT_NAMES = 64
# What a server process knows and a daemon must not inherit, even named in a provider's
# `environment`: its configuration (DATABASE_URL, DJANGO_…, LAKESHORE_…: a daemon gets
# its own URL and token), its broker's and database's, and its XDG folders
# (XDG_CONFIG_HOME holds the CLI's auth.yml, an operator's token).
SERVER_ONLY = ("DATABASE_URL", "DJANGO_", "LAKESHORE_", "CELERY_", "REDIS_", "PG", "XDG_")


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


def _pattern(regex: str, example: str) -> Callable[[object], str | None]:
    """A string matching `regex` whole: one sbatch option's value and nothing more (no
    spaces, no leading dash), so a value can never become another option."""
    compiled = re.compile(regex)

    def check(value) -> str | None:
        if not isinstance(value, str) or not compiled.fullmatch(value) or len(value) > MAX_TEXT:
            return f"must look like {example}"
        return None

    return check


def _absolute_path(value) -> str | None:
    if not isinstance(value, str) or not value.startswith("/") or len(value) > MAX_TEXT:
        return "must be an absolute path"
    if any(ch.isspace() or ch == "\x00" for ch in value):
        return "must be an absolute path without spaces"
    return None


def slurm_conf_problem(value) -> str | None:
    """Why `value` cannot be a provider's `slurm_conf`, or None. Slurm's client commands
    load plugins from the directories a slurm.conf names, so only a file under one of
    LAKESHORE_SLURM_CONF_DIRS (the server owner's word) may be one: no `..`, and the
    path with its links resolved stays under the directory with its links resolved.
    Checked where a config is written and again where the commands run."""
    if (problem := _absolute_path(value)) is not None:
        return problem
    allowed = settings.LAKESHORE_SLURM_CONF_DIRS
    where = ", ".join(allowed) or "nowhere: LAKESHORE_SLURM_CONF_DIRS is empty"
    if ".." not in Path(value).parts:
        resolved = Path(os.path.realpath(value))
        for directory in allowed:
            if resolved.is_relative_to(os.path.realpath(directory)):
                return None
    return (
        f"must be a file under {where} (LAKESHORE_SLURM_CONF_DIRS): Slurm's commands load "
        "plugins from where a slurm.conf says"
    )


# Slurm's own time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_SLURM_TIME = r"\d{1,7}|\d{1,7}:\d{2}|\d{1,7}:\d{2}:\d{2}|\d{1,4}-\d{1,2}(:\d{2}){0,2}"


@dataclass(frozen=True)
class Key:
    check: Callable[[object], str | None]
    meaning: str
    required: bool = False


CREDENTIAL_REF = Key(
    _text(allow_blank=False), "where this provider's credentials live (never the credentials)"
)

MAX_SLURM_CPUS = 4096

# The sbatch options a slurm provider (and each of its instance types) may set, with
# the option each becomes: a documented table (README "Providers"), nothing free-form.
SLURM_RESOURCES: dict[str, tuple[str, Key]] = {
    "partition": (
        "--partition",
        Key(_pattern(r"[A-Za-z0-9_.][A-Za-z0-9_.,-]*", '"debug" or "gpu,cpu"'), "partition"),
    ),
    "account": (
        "--account",
        Key(_pattern(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*", '"ml-team"'), "account to charge"),
    ),
    "qos": ("--qos", Key(_pattern(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*", '"normal"'), "QOS")),
    "time_limit": (
        "--time",
        Key(
            _pattern(_SLURM_TIME, '"60" (minutes), "4:00:00" or "1-12:00:00"'),
            "time limit; at its end Slurm stops the daemon and its work is requeued",
        ),
    ),
    "cpus_per_task": (
        "--cpus-per-task",
        Key(_whole(1, MAX_SLURM_CPUS), f"CPUs for the daemon, 1 to {MAX_SLURM_CPUS}"),
    ),
    "mem": ("--mem", Key(_pattern(r"\d{1,9}[KMGT]?", '"64G" or "4096" (MB)'), "memory")),
    "gres": (
        "--gres",
        Key(_pattern(r"[A-Za-z0-9_][A-Za-z0-9_:.,]*", '"gpu:a100:1"'), "generic resources"),
    ),
    "constraint": (
        "--constraint",
        Key(_pattern(r"[A-Za-z0-9_][A-Za-z0-9_&|,!*\[\]:.]*", '"a100&ib"'), "node features"),
    ),
}
DAEMON_CONCURRENCY = Key(
    _whole(1, MAX_LOCAL_CONCURRENCY),
    f"jobs each daemon runs at once, 1 to {MAX_LOCAL_CONCURRENCY} (default 1)",
)
# What an instance type may set: the resources, and how many jobs its daemon runs.
INSTANCE_TYPE_KEYS = {
    **{key: spec for key, (_, spec) in SLURM_RESOURCES.items()},
    "concurrency": DAEMON_CONCURRENCY,
}
MAX_INSTANCE_TYPES = 100
# Keys that would carry raw sbatch text or a script: refused with a reason of their own.
RAW_SLURM_KEYS = {
    "args", "argv", "arguments", "sbatch", "sbatch_args", "sbatch_arguments", "extra_args",
    "extra", "options", "flags", "script", "wrap", "command", "commands", "prolog",
    "epilog", "env", "export",
}  # fmt: skip
RAW_REFUSED = (
    "raw sbatch arguments and scripts are not accepted (an operator could run any "
    "command through them): use the structured keys ({allowed})"
)


def _instance_types(value) -> str | None:
    if not isinstance(value, dict):
        return 'must be an object like {"a100x1": {"gres": "gpu:a100:1", "cpus_per_task": 8}}'
    if len(value) > MAX_INSTANCE_TYPES:
        return f"at most {MAX_INSTANCE_TYPES} instance types"
    allowed = ", ".join(sorted(INSTANCE_TYPE_KEYS))
    for name, spec in value.items():
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}", str(name)):
            return f"{name!r} is not an instance type name (letters, digits, _.:-)"
        if not isinstance(spec, dict):
            return f"{name}: must be an object of resources ({allowed})"
        for key, item in spec.items():
            if key in RAW_SLURM_KEYS:
                return f"{name}.{key}: " + RAW_REFUSED.format(allowed=allowed)
            check = INSTANCE_TYPE_KEYS.get(key)
            if check is None:
                return f"{name}.{key}: unknown key (allowed: {allowed})"
            if (problem := check.check(item)) is not None:
                return f"{name}.{key}: {problem}"
    return None


def _environment(value) -> str | None:
    if not isinstance(value, list) or len(value) > MAX_ENVIRONMENT_NAMES:
        return f'must be a list of at most {MAX_ENVIRONMENT_NAMES} variable names, like ["HF_HOME"]'
    for name in value:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", name):
            return f"{name!r} is not an environment variable name"
        if name.upper().startswith(SERVER_ONLY):
            return f"{name} is the server's own setting: a daemon never gets it"
    return None


ENVIRONMENT = Key(
    _environment,
    "names of the server's environment variables its daemons also get (what a daemon "
    "needs always passes: PATH, LANG, LC_*, TZ, TMPDIR, PYTHONPATH, VIRTUAL_ENV)",
)


def run_as_problem(value) -> str | None:
    """Why `run_as` cannot be used on this host, or None: the user must exist and not
    be root (uid 0, whatever its name), and a server that is not root can start daemons
    only as its own user."""
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", value):
        return "must be a user name on the server's host"
    try:
        account = pwd.getpwnam(value)
    except KeyError:
        return f"no user {value!r} on the server's host"
    if account.pw_uid == 0:
        return (
            f"{value!r} is root (uid 0): daemons and their jobs never run as root; name an "
            "unprivileged user"
        )
    if os.geteuid() not in (0, account.pw_uid):
        server = pwd.getpwuid(os.geteuid()).pw_name
        return (
            f"the server runs as {server!r}, not root: it cannot start daemons as {value!r} "
            "(run the server as root, or leave run_as out)"
        )
    return None


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
        "concurrency": DAEMON_CONCURRENCY,
        "run_as": Key(
            run_as_problem,
            "the user its daemons and their jobs run as (a server run as root switches to it)",
        ),
        "environment": ENVIRONMENT,
        "credential_ref": CREDENTIAL_REF,
    },
    Provider.Kind.SLURM: {
        **{key: spec for key, (_, spec) in SLURM_RESOURCES.items()},
        "concurrency": DAEMON_CONCURRENCY,
        "instance_types": Key(
            _instance_types, "a queue's --instance-type → resources (and concurrency)"
        ),
        "slurm_conf": Key(
            slurm_conf_problem,
            "the cluster's slurm.conf, under LAKESHORE_SLURM_CONF_DIRS (default: the "
            "server's SLURM_CONF)",
        ),
        "environment": ENVIRONMENT,
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
        if spec is None and kind == Provider.Kind.SLURM and str(key) in RAW_SLURM_KEYS:
            errors[f"config.{key}"] = RAW_REFUSED.format(allowed=allowed)
        elif spec is None:
            errors[f"config.{key}"] = f"unknown key (allowed: {allowed})"
        elif (problem := spec.check(value)) is not None:
            errors[f"config.{key}"] = problem
    for key, spec in schema.items():
        if spec.required and key not in config:
            errors[f"config.{key}"] = "required"
    return errors
