"""What every provider driver builds on: the Driver interface, ProviderError, and the
helpers the drivers that run `lakeshore daemon run` share (queues/drivers.py for
`local` and `simulated`, queues/slurm.py for `slurm`)."""

import os
import shutil
import signal
import sys
import uuid
from pathlib import Path

from accounts.models import Role
from accounts.services import credential_issue, service_user
from queues.models import Daemon, DaemonState, Provider, Queue


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

    def describe(self, *, provider: Provider) -> dict:
        """What `providers show` adds about the provider's live state."""
        return {}


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


# What a server process knows and a daemon must not inherit: the daemon gets its own
# URL and token, nothing else of the server's configuration.
_SERVER_ONLY = ("DATABASE_URL", "DJANGO_", "LAKESHORE_", "CELERY_", "REDIS_", "PG")


def server_free_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_SERVER_ONLY)}


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
