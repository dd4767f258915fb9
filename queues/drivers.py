"""Provider drivers: how a provider kind launches and terminates daemons.

`simulated` records daemons without running anything (they come up after the config's
`startup_seconds`, default 0, and the provider keeps them heartbeating); its config may
say `{"fail": "message"}` to make every launch fail with that message. `local` starts
real `lakeshore daemon run` processes on this host."""

import os
import shutil
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction

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

    def sync(self, *, provider: Provider, queue: Queue, now) -> None:
        """Bring the records up to date with the provider before a tick looks at them."""


class SimulatedDriver(Driver):
    def launch(self, *, provider, queue, count, now):
        failure = (provider.config or {}).get("fail")
        if failure:
            raise ProviderError(str(failure))
        return Daemon.objects.bulk_create(
            [
                Daemon(
                    name=f"{queue.name}-sim-{uuid.uuid4().hex[:8]}",
                    queues=[queue.name],
                    state=DaemonState.PROVISIONING,
                    provider=provider,
                    instance_type=queue.instance_type,
                    external_id=f"sim-{uuid.uuid4()}",
                    last_heartbeat_at=now,
                )
                for _ in range(count)
            ]
        )

    def sync(self, *, provider, queue, now):
        mine = Daemon.objects.live().filter(provider=provider).subscribed_to(queue.name)
        startup = float((provider.config or {}).get("startup_seconds", 0) or 0)
        mine.filter(
            state=DaemonState.PROVISIONING, created_at__lte=now - timedelta(seconds=startup)
        ).update(state=DaemonState.IDLE, updated_at=now)
        # Simulated daemons heartbeat through their provider, as seldom as real ones.
        every = timedelta(seconds=float(settings.LAKESHORE_HEARTBEAT_WRITE_SECONDS))
        mine.filter(last_heartbeat_at__lt=now - every).update(last_heartbeat_at=now)


class LocalDriver(Driver):
    """Daemons as processes on this host: `lakeshore daemon run --queues NAME`, each with
    a daemon token of its own, revoked when the daemon ends. Config: `concurrency`
    (default 1). The processes stop with the worker that started them (they finish
    their work and deregister); the controller starts new ones at its next tick."""

    def __init__(self):
        self.processes: dict[int, subprocess.Popen] = {}  # daemon id → process

    def launch(self, *, provider, queue, count, now):
        from accounts.services import token_create

        command = _lakeshore_command()
        launched = []
        for _ in range(count):
            name = f"{queue.name}-local-{uuid.uuid4().hex[:8]}"
            token, raw = token_create(
                username=f"provider-{provider.name}",
                role="daemon",
                name=f"daemon {name}",
                audited=False,  # made and revoked with the daemon: not an operator's act
            )
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
            args = [command, "daemon", "run", "--queues", queue.name, "--name", name]
            args += ["--concurrency", str(int((provider.config or {}).get("concurrency", 1)))]
            # The process starts only once the rows and the token are committed.
            transaction.on_commit(lambda d=daemon, a=args, r=raw: self._start(d, a, r))
            launched.append(daemon)
        return launched

    def _start(self, daemon: Daemon, args: list[str], raw_token: str) -> None:
        logs = Path(settings.VAR_DIR) / "log" / "daemons"
        env = {
            **_server_free_environ(),
            "LAKESHORE_URL": settings.LAKESHORE_PUBLIC_URL,
            "LAKESHORE_TOKEN": raw_token,
        }
        if settings.LAKESHORE_ALLOWED_MODULES:  # the server owner's word, nobody else's
            env["LAKESHORE_ALLOWED_MODULES"] = ",".join(settings.LAKESHORE_ALLOWED_MODULES)
        try:
            logs.mkdir(parents=True, exist_ok=True)
            with open(logs / f"{daemon.name}.log", "ab") as log:
                process = subprocess.Popen(  # noqa: S603 - our own command, no shell
                    args,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,  # noqa: PLW1509
                )
        except OSError as exc:
            from queues.daemons import daemon_launch_failed

            daemon_launch_failed(daemon=daemon, error=f"could not start {args[0]}: {exc}")
            return
        self.processes[daemon.pk] = process
        Daemon.objects.filter(pk=daemon.pk).update(external_id=f"pid:{process.pid}")

    def sync(self, *, provider, queue, now):
        from queues.daemons import daemons_gone

        exited = [pk for pk, process in self.processes.items() if process.poll() is not None]
        for pk in exited:  # reaped (no zombies); a daemon whose process died has ended
            del self.processes[pk]
        if exited:
            daemons_gone(daemon_ids=exited, reason="daemon process exited")

    def release(self, *, daemon):
        process = self.processes.get(daemon.pk)
        if process is not None and process.poll() is None:
            process.terminate()  # SIGTERM: it stops claiming and leaves


def _lakeshore_command() -> str:
    ours = Path(sys.executable).parent / "lakeshore"  # this installation's CLI first
    command = str(ours) if ours.exists() else (shutil.which("lakeshore") or str(ours))
    if not Path(command).exists():
        raise ProviderError(f"no 'lakeshore' command to start daemons with ({command})")
    return command


# What a server process knows and a daemon must not inherit: the daemon gets its own
# URL and token, nothing else of the server's configuration.
_SERVER_ONLY = ("DATABASE_URL", "DJANGO_", "LAKESHORE_", "CELERY_", "REDIS_", "PG")


def _server_free_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_SERVER_ONLY)}


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


DRIVERS: dict[str, Driver] = {
    Provider.Kind.SIMULATED: SimulatedDriver(),
    Provider.Kind.LOCAL: LocalDriver(),
}


def driver_for(provider: Provider) -> Driver:
    return DRIVERS[provider.kind]
