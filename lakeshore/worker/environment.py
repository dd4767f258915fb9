"""A job process's environment: what of the daemon's environment a job inherits (JOB_ENV,
and the names an operator adds with LAKESHORE_JOB_ENV), what never passes (server
settings and secrets), and the invocation's id and attempt. The processes themselves
are started and killed in lakeshore.pool.processes (start_job_process, kill_job_group)."""

from collections.abc import Mapping

JOB_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_*",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
)
"""The daemon's environment variables a job process inherits; nothing else passes.
A trailing `*` matches a prefix (LC_ALL, LC_CTYPE, ...). The daemon then sets
LAKESHORE_INVOCATION_ID and LAKESHORE_ATTEMPT for each job. An operator adds names with
LAKESHORE_JOB_ENV (comma-separated, exact names); names in JOB_ENV_NEVER or starting
with JOB_ENV_NEVER_PREFIXES are never passed, even if named there."""

JOB_ENV_NEVER_PREFIXES = ("LAKESHORE_", "DJANGO_", "DATABASE_", "CELERY_")
JOB_ENV_NEVER = frozenset(
    {
        # secrets
        "DATABASE_URL",
        "DJANGO_SECRET_KEY",
        "LAKESHORE_TOKEN",
        "LAKESHORE_CLIENT_TOKEN",
        "LAKESHORE_BROKER_URL",
        "PGPASSWORD",
        "PGPASSFILE",
        # the server's other settings (lakeshore_admin/settings.py)
        "ALLOWED_HOSTS",
        "CSRF_TRUSTED_ORIGINS",
        "XDG_CONFIG_HOME",  # where the CLI keeps auth.yml (the daemon's token)
    }
)
JOB_ENV_EXTRA = "LAKESHORE_JOB_ENV"


def _never_passed(name: str) -> bool:
    upper = name.upper()
    return upper in JOB_ENV_NEVER or upper.startswith(JOB_ENV_NEVER_PREFIXES)


def job_env_names(extra: str) -> tuple[list[str], list[str]]:
    """LAKESHORE_JOB_ENV's value → (names passed, names refused)."""
    names = [n.strip() for n in (extra or "").split(",") if n.strip()]
    return [n for n in names if not _never_passed(n)], [n for n in names if _never_passed(n)]


def job_environment(
    source: Mapping[str, str], extra_names: list[str], invocation: dict | None
) -> dict[str, str]:
    """The environment of one job process: JOB_ENV ∪ extra_names from `source`, minus
    anything never passed, plus this invocation's id and attempt (a pool process gets
    those in its os.environ for each invocation it runs: see lakeshore.runner)."""
    exact = {n for n in JOB_ENV if not n.endswith("*")} | set(extra_names)
    prefixes = tuple(n[:-1] for n in JOB_ENV if n.endswith("*"))
    env = {
        name: value
        for name, value in source.items()
        if (name in exact or name.startswith(prefixes)) and not _never_passed(name)
    }
    if invocation is not None:
        env["LAKESHORE_INVOCATION_ID"] = str(invocation["id"])
        env["LAKESHORE_ATTEMPT"] = str(invocation.get("attempts", ""))
    return env
