"""The `slurm` provider: each daemon is one Slurm batch job on the cluster the server's
Slurm client commands reach (`sbatch`, `squeue`, `scancel`, `sinfo`).

- Scale-up records the daemon and mints its token inside the tick; after the tick
  commits, one `sbatch --parsable` per daemon submits a job named
  `lakeshore-<queue>-<daemon id>` whose script runs `lakeshore daemon run`. The URL
  and the token travel in the job's environment (sbatch `--export` of the names of an
  environment made for it, driver_base.daemon_environ: nothing else of the server's),
  never on a command line or in the script, where `squeue`/`scontrol` would show them.
  The job starts in the daemon's own HOME (var/homes/NAME, removed when it ends), not
  in the server's directory. The Slurm job id becomes the daemon's external id; its
  output goes to the daemon's `log_path`.
- Scale-down drains the daemon first (controller); once it runs nothing it is ended
  and its job is `scancel`led, after commit.
- Each tick first asks `squeue` about the provider's jobs (outside the tick's
  transaction), then reconciles inside it: a job that ended marks its daemon lost at
  once (work requeued, token revoked); a job still pending past the start-up grace is
  cancelled and counted as a failed launch; a daemon the reaper marked lost while its
  job still runs is cancelled, so no job runs that the controller does not count.

Why the CLI rather than slurmrestd: the client commands are on every Slurm login node
and use the site's existing munge authentication; slurmrestd is optional, often not
deployed, and needs JWT or socket authentication set up for this server.

Every shell-out has a timeout (LAKESHORE_SLURM_TIMEOUT) and names the command on
failure; missing commands say how to install them."""

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction

from fleet.daemons import daemons_gone, daemons_provider_lost
from fleet.driver_base import (
    Driver,
    ProviderError,
    daemon_environ,
    daemon_home,
    home_environ,
    lakeshore_command,
    mint_daemons,
    remove_daemon_home,
    server_free_environ,
)
from fleet.launches import launch_failed_after_commit, launch_failed_event
from fleet.models import LIVE_DAEMON_STATES, Daemon, DaemonState, Provider
from fleet.provider_configs import SLURM_RESOURCES, slurm_conf_problem
from queues.models import Queue

# squeue's states for a job that will not run (again): its daemon is gone.
ENDED = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "REVOKED",
    "SPECIAL_EXIT",
    "TIMEOUT",
}
WAITING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
RUNNERS = {"": "pool", "pool": "pool", "process": "process"}
INSTALL_HINT = (
    "install the Slurm client commands on this server (Debian: apt-get install "
    "slurm-client munge) and point SLURM_CONF at the cluster's slurm.conf, or set the "
    'provider\'s "slurm_conf"'
)


def job_name(queue_name: str, daemon_id: int) -> str:
    return f"lakeshore-{queue_name}-{daemon_id}"


@dataclass(frozen=True)
class Template:
    """What one daemon of a queue gets: sbatch resource options, and the daemon's own."""

    options: list[str]
    concurrency: int
    isolation: str


def template(provider: Provider, queue: Queue) -> Template:
    """The queue's daemon template on this provider: the config's resources, overlaid
    by the queue's instance type (looked up in `instance_types`), and the runner as the
    daemon's isolation. An unknown instance type or runner is a ProviderError, so the
    tick records a failed launch that says which."""
    config = provider.config or {}
    chosen = {key: config[key] for key in SLURM_RESOURCES if key in config}
    concurrency = int(config.get("concurrency", 1))
    if queue.instance_type:
        types = config.get("instance_types") or {}
        spec = types.get(queue.instance_type)
        if spec is None:
            known = ", ".join(sorted(types)) or "none configured"
            raise ProviderError(
                f"instance type {queue.instance_type!r} is not in provider {provider.name}'s "
                f"instance_types (known: {known})"
            )
        chosen.update({key: spec[key] for key in SLURM_RESOURCES if key in spec})
        concurrency = int(spec.get("concurrency", concurrency))
    isolation = RUNNERS.get(queue.runner)
    if isolation is None:
        raise ProviderError(
            f"runner {queue.runner!r} means nothing to the slurm provider "
            "(use pool, process, or leave it empty)"
        )
    options = [
        f"{SLURM_RESOURCES[key][0]}={chosen[key]}" for key in SLURM_RESOURCES if key in chosen
    ]
    return Template(options=options, concurrency=concurrency, isolation=isolation)


def batch_script(command: str, queue: Queue, daemon: Daemon, t: Template) -> str:
    """The job's script: our own command with quoted names, nothing an operator wrote."""
    args = [command, "daemon", "run", "--queues", queue.name, "--name", daemon.name]
    args += ["--concurrency", str(t.concurrency), "--isolation", t.isolation]
    return (
        "#!/bin/sh\n"
        f"# lakeshore daemon {daemon.pk} for queue {queue.name}: URL and token come in the"
        " environment\n"
        f"exec {shlex.join(args)}\n"
    )


class SlurmCommands:
    """The Slurm client commands for one provider: its `slurm_conf`, or the server's
    environment. Each call has a timeout and raises ProviderError with Slurm's words."""

    def __init__(self, provider: Provider):
        self.provider = provider
        env = {k: v for k, v in server_free_environ().items() if not k.startswith("SLURM_")}
        own = (provider.config or {}).get("slurm_conf")
        self.conf_problem = slurm_conf_problem(own) if own else None
        conf = own or os.environ.get("SLURM_CONF")
        if conf:
            env["SLURM_CONF"] = conf
        self.env = env

    def run(self, command: str, args: list[str], *, stdin: str | None = None, env=None) -> str:
        self.require(command)
        program = shutil.which(command, path=self.env.get("PATH", os.defpath))
        timeout = float(settings.LAKESHORE_SLURM_TIMEOUT)
        try:
            done = subprocess.run(  # noqa: S603 - our own argv, no shell
                [program, *args],
                input=stdin,
                env=env or self.env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise ProviderError(f"{command} did not answer within {timeout:g} s") from exc
        except OSError as exc:
            raise ProviderError(f"{command} could not run: {exc}") from exc
        if done.returncode != 0:
            said = " ".join(line.strip() for line in done.stderr.splitlines() if line.strip())
            hint = ""
            if "configuration source" in said and not self.env.get("SLURM_CONF"):
                hint = (
                    " (the server has no SLURM_CONF in its environment and the provider no "
                    '"slurm_conf": set one)'
                )
            raise ProviderError(f"{command} failed: {said or f'exit code {done.returncode}'}{hint}")
        return done.stdout

    def sbatch(self, script: str, options: list[str], env: dict[str, str]) -> str:
        out = self.run("sbatch", ["--parsable", *options], stdin=script, env={**self.env, **env})
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise ProviderError(f"sbatch printed no job id ({out.strip()[:200]!r})")
        return job_id

    def require(self, command: str) -> None:
        """Refuse at once (inside the tick, before anything is recorded) when `command`
        cannot run here."""
        if self.conf_problem:  # the directories allowed may have changed since it was set
            raise ProviderError(f"slurm_conf {self.env['SLURM_CONF']}: {self.conf_problem}")
        if shutil.which(command, path=self.env.get("PATH", os.defpath)) is None:
            raise ProviderError(f"{command}: command not found: {INSTALL_HINT}")
        conf = self.env.get("SLURM_CONF")
        if conf and not Path(conf).is_file():
            raise ProviderError(f"SLURM_CONF {conf} is not a file: {INSTALL_HINT}")

    def squeue(self, job_ids: list[str]) -> dict[str, dict]:
        """These jobs, in any state Slurm still remembers (a job it has forgotten is
        simply absent): id → fields. One id is given twice, because squeue answers a
        single unknown id with an error but leaves unknown ids out of a list."""
        if not job_ids:
            return {}
        ids = job_ids * 2 if len(job_ids) == 1 else job_ids
        out = self.run("squeue", ["-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%j|%T|%r|%M"])
        return _parse_jobs(out)

    def live_jobs(self) -> dict[str, dict]:
        return _parse_jobs(self.run("squeue", ["-h", "-o", "%i|%j|%T|%r|%M"]))

    def scancel(self, job_id: str) -> None:
        self.run("scancel", [job_id])

    def sinfo(self) -> list[dict]:
        out = self.run("sinfo", ["-h", "-o", "%P|%a|%D|%T|%C"])
        rows = []
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) == 5:
                partition, avail, nodes, state, cpus = parts
                rows.append(
                    {
                        "partition": partition,
                        "avail": avail,
                        "nodes": nodes,
                        "state": state,
                        "cpus": cpus,  # allocated/idle/other/total
                    }
                )
        return rows


def _parse_jobs(out: str) -> dict[str, dict]:
    jobs = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 5:
            job_id, name, state, reason, elapsed = parts
            jobs[job_id] = {
                "id": job_id,
                "name": name,
                "state": state.split()[0] if state else "",
                "reason": "" if reason in ("None", "(null)") else reason,
                "elapsed": elapsed,
            }
    return jobs


SQUEUE_CHUNK = 1000  # job ids per squeue call: a command line of a few kilobytes


@dataclass(frozen=True)
class Observed:
    """What squeue said about the daemons a tick asked about (others are not judged)."""

    asked: dict[int, str]  # daemon id → Slurm job id
    jobs: dict[str, dict]  # Slurm job id → its squeue fields


class SlurmDriver(Driver):
    def launch(self, *, provider, queue, count, now):
        t = template(provider, queue)  # a bad instance type or runner fails the tick's launch
        command = lakeshore_command()
        SlurmCommands(provider).require("sbatch")  # missing: a failed launch, nothing recorded
        minted = mint_daemons(provider=provider, queue=queue, count=count, now=now, kind="slurm")
        logs = Path(settings.VAR_DIR) / "log" / "daemons"
        for daemon, _ in minted:
            daemon.log_path = str(logs / f"{daemon.name}.log")
            daemon.external_id = ""
        Daemon.objects.bulk_update([d for d, _ in minted], ["log_path"])
        transaction.on_commit(lambda: self._submit(provider, queue, minted, t, command))
        return [daemon for daemon, _ in minted]

    def _submit(self, provider, queue, minted, t: Template, command: str) -> None:
        """After commit: one sbatch per daemon. The first refusal fails the rest of this
        launch with Slurm's message (one launch_failed event, then back-off)."""
        slurm = SlurmCommands(provider)
        for index, (daemon, raw_token) in enumerate(minted):
            try:
                Path(daemon.log_path).parent.mkdir(parents=True, exist_ok=True)
                home = daemon_home(daemon.name, None)
                env = home_environ(daemon_environ(provider=provider, token=raw_token), home, None)
                options = [
                    f"--job-name={job_name(queue.name, daemon.pk)}",
                    f"--output={daemon.log_path}",
                    f"--chdir={home}",
                    f"--export={','.join(sorted(env))}",  # these names only, never ALL
                    "--no-requeue",  # a daemon whose node fails is replaced, not rerun
                    *t.options,
                ]
                job_id = slurm.sbatch(batch_script(command, queue, daemon, t), options, env)
            except (ProviderError, OSError) as exc:
                for unsubmitted, _ in minted[index:]:
                    remove_daemon_home(unsubmitted.name)
                launch_failed_after_commit(
                    queue_id=queue.pk,
                    daemon_ids=[d.pk for d, _ in minted[index:]],
                    error=str(exc),
                )
                return
            Daemon.objects.filter(pk=daemon.pk).update(external_id=job_id)

    def observe(self, *, provider, queue):
        return self.observe_queues(provider=provider, queues=[queue])[queue.pk]

    def observe_queues(self, *, provider, queues):
        """The daemons of all these queues in one query, their jobs in one `squeue`
        (SQUEUE_CHUNK ids a call)."""
        by_name = {queue.name: queue.pk for queue in queues}
        rows = (
            Daemon.objects.filter(provider=provider)
            .subscribed_to_any(list(by_name))
            .exclude(external_id="")
            .filter(state__in=[*LIVE_DAEMON_STATES, DaemonState.LOST])
            .exclude(state=DaemonState.LOST, token__revoked_at__isnull=False)
            .values_list("pk", "external_id", "queues")
        )
        asked: dict[int, dict[int, str]] = {pk: {} for pk in by_name.values()}
        for pk, job_id, names in rows:
            for name in names:
                if name in by_name:
                    asked[by_name[name]][pk] = job_id
        job_ids = sorted({job for mine in asked.values() for job in mine.values()}, key=int)
        jobs: dict[str, dict] = {}
        slurm = SlurmCommands(provider)
        for start in range(0, len(job_ids), SQUEUE_CHUNK):
            jobs.update(slurm.squeue(job_ids[start : start + SQUEUE_CHUNK]))
        return {
            queue_id: Observed(asked=mine, jobs=jobs if mine else {})
            for queue_id, mine in asked.items()
        }

    def sync(self, *, provider, queue, now, observed=None):
        if not observed or not observed.asked:
            return
        rows = {
            d.pk: d
            for d in Daemon.objects.filter(pk__in=list(observed.asked)).select_related("token")
        }
        live_jobs = {
            d.external_id for d in rows.values() if d.state in LIVE_DAEMON_STATES
        }  # a daemon that registered again keeps its job: that job is counted
        ended, silent, stuck, requeued = {}, [], [], []
        grace = timedelta(seconds=settings.LAKESHORE_STARTUP_GRACE)
        for pk, job_id in observed.asked.items():
            daemon = rows.get(pk)
            if daemon is None or daemon.external_id != job_id:
                continue  # changed since squeue was asked: next tick
            job = observed.jobs.get(job_id)
            state = job["state"] if job else "GONE"
            if job is None or state in ENDED:
                why = f"slurm job {job_id} ended: {state}" + (
                    f" ({job['reason']})" if job and job["reason"] else ""
                )
                if job is None:
                    why = f"slurm job {job_id} is gone from squeue"
                ended[pk] = why
            elif daemon.state == DaemonState.LOST and job_id not in live_jobs:
                silent.append(pk)
            elif state in WAITING and daemon.state != DaemonState.PROVISIONING:
                requeued.append(pk)  # its process is gone: Slurm put the job back
            elif (
                state in WAITING
                and daemon.state == DaemonState.PROVISIONING
                and daemon.created_at <= now - grace
            ):
                stuck.append((pk, job_id, job["reason"]))
        for pk, why in ended.items():  # each with its own reason
            daemons_provider_lost(daemon_ids=[pk], reason=why, release=False)
            transaction.on_commit(lambda name=rows[pk].name: remove_daemon_home(name))
        if silent:
            daemons_provider_lost(
                daemon_ids=silent,
                reason="silent past the heartbeat timeout while its slurm job runs: cancelled",
                release=True,
            )
        if requeued:
            daemons_provider_lost(
                daemon_ids=requeued,
                reason="its slurm job went back to pending (requeued by Slurm): cancelled",
                release=True,
            )
        if stuck:
            daemons_gone(daemon_ids=[pk for pk, _, _ in stuck], reason="launch failed")
            _, job_id, reason = stuck[0]
            waited = settings.LAKESHORE_STARTUP_GRACE
            launch_failed_event(
                queue,
                count=len(stuck),
                error=f"slurm job {job_id} still pending after {waited:g} s"
                + (f" (Reason={reason})" if reason else "")
                + "; cancelled",
                now=now,
            )

    def release(self, *, daemon):
        if daemon.external_id:
            SlurmCommands(daemon.provider).scancel(daemon.external_id)
        remove_daemon_home(daemon.name)

    def observe_status(self, *, provider):
        """sinfo's partitions, and the provider's live jobs with their daemons."""
        slurm = SlurmCommands(provider)
        partitions = slurm.sinfo()  # a ProviderError: the cluster is unreachable
        ours = dict(
            Daemon.objects.filter(provider=provider)
            .exclude(external_id="")
            .exclude(state=DaemonState.TERMINATED)
            .values_list("external_id", "pk")
        )
        try:
            jobs = slurm.live_jobs()
        except ProviderError as exc:
            return {"reachable": True, "error": str(exc), "partitions": partitions, "jobs": []}
        listed = [
            {**job, "daemon": str(ours[job_id])}
            for job_id, job in sorted(jobs.items(), key=lambda item: int(item[0]))
            if job_id in ours
        ]
        return {"reachable": True, "error": "", "partitions": partitions, "jobs": listed}

    def describe(self, *, provider):
        """What the controller's tick last observed, and when (`reachable` null: not
        observed yet)."""
        seen = provider.observed or {"reachable": None, "error": "", "partitions": [], "jobs": []}
        return {**seen, "observed_at": provider.observed_at}
