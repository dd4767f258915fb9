"""What every provider driver builds on: the Driver interface, ProviderError, and the
helpers the drivers that run `lakeshore daemon run` share (fleet/drivers.py for
`local` and `simulated`, fleet/slurm.py for `slurm`)."""

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import sys
import uuid
from pathlib import Path

from django.conf import settings

from accounts.models import Role
from accounts.services import credential_issue, service_user
from fleet.models import Daemon, DaemonState, Provider
from fleet.provider_configs import SERVER_ONLY, run_as_problem
from lakeshore.private import private_dir
from lakeshore.worker.environment import job_environment
from queues.models import Queue


class ProviderError(Exception):
    """The provider refused or failed; the message is the provider's own."""


class Driver:
    """Launch records new daemons inside the tick's transaction and does its outside
    work (start a process, submit a job) only after that transaction commits; release
    stops what runs an ended daemon, also after commit. A rolled-back tick leaves no
    process and no token behind."""

    def launch(self, *, provider: Provider, queue: Queue, count: int, now) -> list[Daemon]:
        raise NotImplementedError

    def release(self, *, daemon: Daemon) -> None:
        """After commit: stop whatever runs this (terminated) daemon."""

    def observe(self, *, provider: Provider, queue: Queue):
        """Before the tick's transaction: ask the provider what it runs (a shell-out or
        an HTTP call must not hold the tick's locks). Handed to sync."""
        return None

    def sync(self, *, provider: Provider, queue: Queue, now, observed=None) -> None:
        """Bring the records up to date with the provider before a tick looks at them."""

    def observe_queues(self, *, provider: Provider, queues: list[Queue]) -> dict:
        """observe for many of this provider's queues (a tick over all of them): queue
        id → what observe says. A driver that can ask once for all of them does so."""
        return {queue.pk: self.observe(provider=provider, queue=queue) for queue in queues}

    def sync_queues(self, *, provider: Provider, queues: list[Queue], now, observed) -> None:
        """sync for many of this provider's queues (`observed`: observe_queues'
        answer). A driver that can bring them all up to date at once does so."""
        for queue in queues:
            self.sync(provider=provider, queue=queue, now=now, observed=observed.get(queue.pk))

    def describe(self, *, provider: Provider) -> dict:
        """What `providers show` adds about the provider's live state, read without asking
        the provider anything (no shell-out, no HTTP call): a read must stay cheap for
        any viewer. What must be asked is asked by the tick (observe_status)."""
        return {}

    def observe_status(self, *, provider: Provider) -> dict | None:
        """The controller's tick, outside its transaction: ask the provider what it runs
        (slurm: sinfo, squeue), to be stored on the provider with its time and shown by
        describe. None: nothing to ask. ProviderError: a failed observation."""
        return None


def mint_daemons(*, provider, queue, count: int, now, kind: str) -> list[tuple[Daemon, str]]:
    """Inside the tick: `count` provisioning daemon rows for `queue`, each with its own
    credential (returned raw once): it acts for that daemon only, serves `queue` only,
    and is revoked when the daemon ends. Not audited: made and revoked with the daemon,
    not an operator's act."""
    user = service_user(f"provider-{provider.name}", Role.DAEMON)
    minted = []
    for _ in range(count):
        name = f"{queue.name}-{kind}-{uuid.uuid4().hex[:8]}"
        token, raw = credential_issue(user=user, name=name, queues=[queue.name])
        daemon = Daemon.objects.create(
            name=name,
            queues=[queue.name],
            state=DaemonState.PROVISIONING,
            provider=provider,
            instance_type=queue.instance_type,
            owner=token.user,
            token=token,
            last_heartbeat_at=now,
        )
        minted.append((daemon, raw))
    return minted


def lakeshore_command() -> str:
    ours = Path(sys.executable).parent / "lakeshore"  # this installation's CLI first
    command = str(ours) if ours.exists() else (shutil.which("lakeshore") or str(ours))
    if not Path(command).exists():
        raise ProviderError(f"no 'lakeshore' command to start daemons with ({command})")
    return command


def server_free_environ() -> dict[str, str]:
    """The server's environment without its own settings: for the commands the server
    itself runs (Slurm's clients), never for a daemon (daemon_environ)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(SERVER_ONLY)}


def daemon_environ(*, provider: Provider, token: str) -> dict[str, str]:
    """A provider-started daemon's whole environment, allow-listed: the server's may
    hold a cloud key or a database password, and a daemon's jobs can read its
    /proc/PID/environ. It gets what it needs to run (lakeshore.worker.environment's
    JOB_ENV: PATH, LANG, LC_*, TZ, TMPDIR, its Python's PYTHONPATH and VIRTUAL_ENV),
    the names its provider's config lists in `environment`, its server's URL, its own
    credential, and LAKESHORE_ALLOWED_MODULES (the server owner's word). HOME (and
    USER, LOGNAME) are its own: home_environ."""
    named = [
        name
        for name in (provider.config or {}).get("environment") or []
        if not name.upper().startswith(SERVER_ONLY)  # refused in the config too
    ]
    env = job_environment(dict(os.environ), named, None)
    env.pop("HOME", None)
    env["LAKESHORE_URL"] = settings.LAKESHORE_PUBLIC_URL
    env["LAKESHORE_TOKEN"] = token
    if settings.LAKESHORE_ALLOWED_MODULES:
        env["LAKESHORE_ALLOWED_MODULES"] = ",".join(settings.LAKESHORE_ALLOWED_MODULES)
    return env


# ---------------------------------------------------------------------------- job homes


def homes_dir() -> Path:
    return Path(settings.VAR_DIR) / "homes"


def daemon_home(name: str, account: pwd.struct_passwd | None) -> Path:
    """var/homes/NAME: the HOME of a daemon and its jobs, not the server's (where
    `make run` keeps an operator's token). 0700, owned by `account` when it runs as
    that user; var/ and var/homes then let that user through to it, and only that."""
    uid = (account.pw_uid,) if account is not None else ()
    private_dir(Path(settings.VAR_DIR), traverse=uid)
    home = private_dir(homes_dir(), traverse=uid) / name
    home.mkdir(mode=0o700)
    if account is not None:
        os.chown(home, account.pw_uid, account.pw_gid)
    return home


def remove_daemon_home(name: str) -> None:
    """A daemon that ended: its HOME goes (fd-based: links inside stay inside)."""
    if name and "/" not in name and name not in (".", ".."):
        shutil.rmtree(homes_dir() / name, ignore_errors=True)


def home_environ(env: dict[str, str], home: Path, account: pwd.struct_passwd | None) -> dict:
    """`env` with HOME (and, run as another user, USER and LOGNAME) its daemon's own."""
    env = {**env, "HOME": str(home)}
    if account is not None:
        env["USER"] = env["LOGNAME"] = account.pw_name
    return env


def run_as_account(name: str | None) -> pwd.struct_passwd | None:
    """The user a provider's `run_as` names (None: the server's own user), checked
    again where the daemons start: ProviderError when it cannot be used here."""
    if not name:
        return None
    problem = run_as_problem(name)
    if problem:
        raise ProviderError(f"run_as: {problem}")
    return pwd.getpwnam(name)


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# Each kind's driver, filled by fleet/drivers.py when the app loads (FleetConfig.ready).
# The daemon lifecycle (fleet/daemons.py) finds a driver here without importing the
# drivers, which report back to it (a daemon gone, a launch failed).
DRIVERS: dict[str, Driver] = {}


def driver_for(provider: Provider) -> Driver:
    return DRIVERS[provider.kind]
