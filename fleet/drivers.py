"""Provider drivers: how a provider kind launches and terminates daemons.

`simulated` records daemons without running anything (they come up after the config's
`startup_seconds`, default 0, and the provider keeps them heartbeating); its config may
say `{"fail": "message"}` to make every launch fail with that message. `local` starts
real `lakeshore daemon run` processes on this host. `slurm` (fleet/slurm.py) submits
one batch job per daemon to a Slurm cluster."""

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction

from fleet.daemons import daemons_gone
from fleet.driver_base import (
    DRIVERS,
    Driver,
    ProviderError,
    _die_with_parent,
    daemon_environ,
    daemon_home,
    home_environ,
    lakeshore_command,
    mint_daemons,
    run_as_account,
)
from fleet.launches import launch_failed_after_commit
from fleet.models import Daemon, DaemonState, Provider
from fleet.slurm import SlurmDriver
from lakeshore.private import private_dir


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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

    def sync(self, *, provider, queue, now, observed=None):
        self.sync_queues(provider=provider, queues=[queue], now=now, observed={})

    def sync_queues(self, *, provider, queues, now, observed):
        """Two statements for all the queues, however many."""
        names = [queue.name for queue in queues]
        mine = Daemon.objects.live().filter(provider=provider).subscribed_to_any(names)
        startup = float((provider.config or {}).get("startup_seconds", 0) or 0)
        mine.filter(
            state=DaemonState.PROVISIONING, created_at__lte=now - timedelta(seconds=startup)
        ).update(state=DaemonState.IDLE, updated_at=now)
        # Simulated daemons heartbeat through their provider, as seldom as real ones
        # renew (a third of the heartbeat timeout), so that 100,000 of them do not
        # rewrite 100,000 rows every tick.
        every = timedelta(
            seconds=max(
                float(settings.LAKESHORE_HEARTBEAT_WRITE_SECONDS),
                settings.LAKESHORE_HEARTBEAT_TIMEOUT / 3,
            )
        )
        mine.filter(last_heartbeat_at__lt=now - every).update(last_heartbeat_at=now)


class LocalDriver(Driver):
    """Daemons as processes on this host: `lakeshore daemon run --queues NAME`, each with
    a daemon token of its own, revoked when the daemon ends, and a HOME of its own
    (var/homes/NAME, removed when it ends), and an allow-listed environment
    (driver_base.daemon_environ). Config: `concurrency` (default 1), `run_as` (a user:
    the server, run as root, starts the daemons as that user, who owns their home) and
    `environment` (names of the server's variables its daemons also get). The processes
    stop with the worker that started them (they finish their work and deregister); the
    controller starts new ones at its next tick."""

    def __init__(self):
        self.processes: dict[int, subprocess.Popen] = {}  # daemon id → process
        self.homes: dict[int, Path] = {}  # daemon id → its HOME

    def launch(self, *, provider, queue, count, now):
        command = lakeshore_command()
        account = run_as_account((provider.config or {}).get("run_as"))
        launched = []
        for daemon, raw in mint_daemons(
            provider=provider, queue=queue, count=count, now=now, kind="local"
        ):
            args = [command, "daemon", "run", "--queues", queue.name, "--name", daemon.name]
            args += ["--concurrency", str(int((provider.config or {}).get("concurrency", 1)))]
            daemon.log_path = str(Path(settings.VAR_DIR) / "log" / "daemons" / f"{daemon.name}.log")
            daemon.save(update_fields=["log_path"])
            # The process starts only once the rows and the token are committed.
            env = daemon_environ(provider=provider, token=raw)
            transaction.on_commit(
                lambda d=daemon, a=args, e=env, q=queue.pk: self._start(d, a, e, q, account)
            )
            launched.append(daemon)
        return launched

    def _start(self, daemon, args: list[str], env: dict, queue_id: int, account) -> None:
        logs = Path(settings.VAR_DIR) / "log" / "daemons"
        user = {}
        if account is not None and account.pw_uid != os.geteuid():
            groups = os.getgrouplist(account.pw_name, account.pw_gid)  # as initgroups
            user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": groups}
        try:
            private_dir(private_dir(logs.parent) / logs.name)  # the server's alone
            home = daemon_home(daemon.name, account)
            self.homes[daemon.pk] = home
            with open(logs / f"{daemon.name}.log", "ab") as log:
                process = subprocess.Popen(  # noqa: S603 - our own command, no shell
                    args,
                    env=home_environ(env, home, account),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,  # noqa: PLW1509
                    **user,
                )
        except OSError as exc:
            self._remove_home(daemon.pk)
            who = f" as {account.pw_name}" if user else ""
            launch_failed_after_commit(
                queue_id=queue_id,
                daemon_ids=[daemon.pk],
                error=f"could not start {args[0]}{who}: {exc}",
            )
            return
        self.processes[daemon.pk] = process
        Daemon.objects.filter(pk=daemon.pk).update(external_id=f"pid:{process.pid}")

    def _remove_home(self, pk: int) -> None:
        home = self.homes.pop(pk, None)
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)  # fd-based: links inside stay inside

    def stop_all(self, timeout: float) -> None:
        """The worker that started these daemons is stopping: each gets one SIGTERM (it
        finishes its work and deregisters while the web server still answers) and the
        worker waits for them, `timeout` seconds at most. Without the wait their death
        signal (the worker's exit) would be a second SIGTERM: stop running jobs now."""
        live = [process for process in self.processes.values() if process.poll() is None]
        for process in live:
            process.terminate()
        deadline = time.monotonic() + timeout
        for process in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.0, deadline - time.monotonic()))

    def sync_queues(self, *, provider, queues, now, observed):
        """Its processes are this worker's, whatever their queue: looked at once."""
        self.sync(provider=provider, queue=None, now=now)

    def sync(self, *, provider, queue, now, observed=None):
        exited = [pk for pk, process in self.processes.items() if process.poll() is not None]
        for pk in exited:  # reaped (no zombies); a daemon whose process died has ended
            del self.processes[pk]
            self._remove_home(pk)
        if exited:
            daemons_gone(daemon_ids=exited, reason="daemon process exited")

    def release(self, *, daemon):
        process = self.processes.get(daemon.pk)
        if process is not None and process.poll() is None:
            process.terminate()  # SIGTERM: it stops claiming and leaves

    def describe(self, *, provider):
        """Its live daemons' processes on this host (the worker that started them holds
        them; any process here can see whether each pid still runs)."""
        processes = []
        for pk, external in (
            Daemon.objects.live()
            .filter(provider=provider, external_id__startswith="pid:")
            .order_by("pk")
            .values_list("pk", "external_id")
        ):
            pid = int(external.removeprefix("pid:"))
            processes.append({"daemon": str(pk), "pid": pid, "running": _pid_runs(pid)})
        return {"processes": processes}


DRIVERS.update(
    {
        Provider.Kind.SIMULATED: SimulatedDriver(),
        Provider.Kind.LOCAL: LocalDriver(),
        Provider.Kind.SLURM: SlurmDriver(),
    }
)
