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
from django.utils import timezone

from queues.models import Daemon, DaemonState, Provider, Queue


class ProviderError(Exception):
    """The provider refused or failed; the message is the provider's own."""


class Driver:
    def launch(self, *, provider: Provider, queue: Queue, count: int, now) -> list[Daemon]:
        raise NotImplementedError

    def terminate(self, *, daemon: Daemon) -> None:
        from jobs.services import daemon_drop

        daemon_drop(daemon=daemon)

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
        mine.update(last_heartbeat_at=now)  # simulated daemons heartbeat through it


class LocalDriver(Driver):
    """Daemons as processes on this host: `lakeshore daemon run --queues NAME`, each with
    a daemon token of its own (revoked when it is terminated). Config: `concurrency`
    (default 1) and `allowed_modules` (comma-separated, for LAKESHORE_ALLOWED_MODULES).
    The processes stop with the worker that started them (they finish their work and
    deregister); the controller starts new ones at its next tick."""

    def __init__(self):
        self.processes: dict[int, subprocess.Popen] = {}  # daemon id → process

    def launch(self, *, provider, queue, count, now):
        from accounts.services import token_create

        config = provider.config or {}
        ours = Path(sys.executable).parent / "lakeshore"  # this installation's CLI first
        command = str(ours) if ours.exists() else (shutil.which("lakeshore") or str(ours))
        if not Path(command).exists():
            raise ProviderError(f"no 'lakeshore' command to start daemons with ({command})")
        logs = Path(settings.VAR_DIR) / "log" / "daemons"
        logs.mkdir(parents=True, exist_ok=True)
        launched = []
        for _ in range(count):
            name = f"{queue.name}-local-{uuid.uuid4().hex[:8]}"
            token, raw = token_create(
                username=f"provider-{provider.name}", role="daemon", name=f"daemon {name}"
            )
            daemon = Daemon.objects.create(
                name=name,
                queues=[queue.name],
                state=DaemonState.PROVISIONING,
                provider=provider,
                instance_type=queue.instance_type,
                owner=token.user,
                last_heartbeat_at=now,
            )
            env = {
                **os.environ,
                "LAKESHORE_URL": settings.LAKESHORE_PUBLIC_URL,
                "LAKESHORE_TOKEN": raw,
            }
            if config.get("allowed_modules"):
                env["LAKESHORE_ALLOWED_MODULES"] = str(config["allowed_modules"])
            args = [command, "daemon", "run", "--queues", queue.name, "--name", name]
            args += ["--concurrency", str(int(config.get("concurrency", 1)))]
            try:
                with open(logs / f"{name}.log", "ab") as log:
                    process = subprocess.Popen(  # noqa: S603 - our own command, no shell
                        args,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        preexec_fn=_die_with_parent,  # noqa: PLW1509
                    )
            except OSError as exc:
                daemon.delete()
                token.revoke()
                raise ProviderError(f"could not start {command}: {exc}") from exc
            self.processes[daemon.pk] = process
            Daemon.objects.filter(pk=daemon.pk).update(external_id=f"pid:{process.pid}")
            launched.append(daemon)
        return launched

    def sync(self, *, provider, queue, now):
        for daemon_id, process in list(self.processes.items()):
            if process.poll() is not None:  # reap the exited ones (no zombies)
                del self.processes[daemon_id]

    def terminate(self, *, daemon):
        from accounts.models import ApiToken

        super().terminate(daemon=daemon)  # terminated: it stops at its next heartbeat
        ApiToken.objects.filter(
            user_id=daemon.owner_id, name=f"daemon {daemon.name}", revoked_at__isnull=True
        ).update(revoked_at=timezone.now())
        process = self.processes.get(daemon.pk)
        if process is not None and process.poll() is None:
            process.terminate()  # SIGTERM: it finishes what it runs and leaves


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
