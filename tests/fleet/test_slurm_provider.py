"""The `slurm` provider against a real Slurm cluster: each daemon is one batch job that
runs `lakeshore daemon run` against the live server, and the controller's ticks
launch, reconcile and end them."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.utils import timezone

from accounts.models import ApiToken
from fleet import controller
from fleet.models import Daemon
from fleet.services import provider_status, providers_observe
from jobs import services
from jobs.models import Invocation
from queues.models import Queue, QueueEvent
from queues.services import queue_patch
from tests.support import builders
from tests.support.slurm import ours, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("slurm"),  # one cluster per test process: keep them on one
    pytest.mark.slurm,
]

LAKESHORE = str(Path(sys.executable).parent / "lakeshore")


@pytest.fixture
def hpc(slurm_cluster, live_server, settings, tmp_path):
    settings.LAKESHORE_PUBLIC_URL = live_server.url
    settings.VAR_DIR = tmp_path
    settings.LAKESHORE_SLURM_CONF_DIRS = [str(slurm_cluster.dir)]
    settings.LAKESHORE_STARTUP_GRACE = 30
    settings.LAKESHORE_SCALE_DOWN_WINDOW = 0
    settings.LAKESHORE_HEARTBEAT_TIMEOUT = 600  # what ends a daemon here is Slurm, not silence
    slurm_cluster.cancel_all()
    provider = builders.provider(
        name="hpc", kind="slurm", config={"partition": "debug", "slurm_conf": slurm_cluster.conf}
    )
    yield provider
    slurm_cluster.cancel_all()


def _tick(queue_name: str) -> QueueEvent:
    event = builders.tick_queue(Queue.objects.get(name=queue_name).pk)
    assert event is not None
    return event


def _cli(live_server, tmp_path, *args) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "LAKESHORE_URL": live_server.url,
        "LAKESHORE_TOKEN": builders.token("operator"),
        "XDG_CONFIG_HOME": str(tmp_path),
    }
    return subprocess.run([LAKESHORE, *args], env=env, capture_output=True, text=True, timeout=60)


def test_scale_up_runs_real_work_in_slurm_jobs_and_scale_down_ends_them(
    hpc, slurm_cluster, live_server, tmp_path, settings
):
    builders.queue(name="train", provider="hpc", elasticity_spec={"kind": "fixed", "min": 2})
    up = _tick("train")
    assert (up.action, up.delta) == ("scale_up", 2)
    daemons = list(Daemon.objects.order_by("pk"))
    assert len(daemons) == 2

    # squeue lists one job per daemon, named for the queue and the daemon, and the daemon
    # knows its job by id
    wait_for(lambda: all(d.external_id for d in Daemon.objects.all()), what="job ids")
    jobs = ours(slurm_cluster, "train")
    by_daemon = {d.pk: d for d in Daemon.objects.all()}
    assert {name for name, _ in jobs.values()} == {f"lakeshore-train-{pk}" for pk in by_daemon}
    assert set(jobs) == {d.external_id for d in by_daemon.values()}

    wait_for(
        lambda: Daemon.objects.filter(state="idle").count() == 2,
        what="both daemons to register from inside their Slurm jobs",
    )
    submitted = [
        services.invocation_submit(function="lakeshore.functions.echo", queue="train", args=[n])[0]
        for n in range(6)
    ]
    wait_for(lambda: Invocation.objects.filter(state="succeeded").count() == 6, what="the work")
    ran_on = set(
        Invocation.objects.filter(pk__in=[i.pk for i in submitted]).values_list(
            "daemon_id", flat=True
        )
    )
    assert ran_on <= set(by_daemon)
    assert [i.result["args"] for i in Invocation.objects.order_by("pk")] == [[n] for n in range(6)]

    # the token is nowhere Slurm shows: not in the job's record, not in its script
    for job_id in jobs:
        shown = slurm_cluster.run("scontrol", "show", "job", "-dd", job_id)
        script = slurm_cluster.run("scontrol", "write", "batch_script", job_id, "-")
        assert "lsk_" not in shown and "lsk_" not in script
        assert "LAKESHORE_TOKEN" not in script and "daemon run --queues train" in script

    # the log is where `daemon show` says
    daemon = daemons[0]
    shown = _cli(live_server, tmp_path, "daemon", "show", str(daemon.pk))
    assert shown.returncode == 0, shown.stderr
    log_path = Daemon.objects.get(pk=daemon.pk).log_path
    assert "Log:" in shown.stdout and log_path in shown.stdout
    assert f"registered daemon {daemon.pk}" in Path(log_path).read_text()

    # scale-down: drained, then cancelled; squeue is empty after the window
    settings.LAKESHORE_STARTUP_GRACE = 0  # they are past it
    queue_patch(name="train", changes={"elasticity": {"min": 0}})
    down = _tick("train")
    assert (down.action, down.delta) == ("scale_down", -2)
    wait_for(lambda: not ours(slurm_cluster, "train"), what="squeue to be empty")
    for d in Daemon.objects.all():
        assert d.state == "terminated"
        assert ApiToken.objects.get(pk=d.token_id).revoked_at is not None
    assert Invocation.objects.exclude(state="succeeded").count() == 0


def test_never_more_slurm_jobs_than_max(hpc, slurm_cluster):
    builders.queue(
        name="burst",
        provider="hpc",
        elasticity_spec={"kind": "fully_elastic", "min": 0, "max": 2},
    )
    for _ in range(12):
        services.invocation_submit(function="lakeshore.functions.sleep", queue="burst", args=[1])
    seen = []
    deadline = time.monotonic() + 60
    while Invocation.objects.exclude(state="succeeded").exists():
        assert time.monotonic() < deadline, "the work did not finish"
        _tick("burst")
        seen.append(len(ours(slurm_cluster, "burst")))
        assert seen[-1] <= 2, seen
        time.sleep(0.3)
    assert max(seen) == 2  # it did grow to --max, and never past it
    assert Daemon.objects.count() == 2  # no daemon was launched beyond the two


def _one_daemon_running_a_sleep(seconds: float) -> tuple[Daemon, Invocation]:
    """Queue gpu with one Slurm daemon, running a sleep that may run twice."""
    builders.queue(name="gpu", provider="hpc", elasticity_spec={"kind": "fixed", "min": 1})
    _tick("gpu")
    wait_for(lambda: Daemon.objects.filter(state="idle").exists(), what="the daemon")
    inv, _ = services.invocation_submit(
        function="lakeshore.functions.sleep", queue="gpu", args=[seconds], max_attempts=2
    )
    wait_for(lambda: Invocation.objects.get(pk=inv.pk).state == "running", what="the claim")
    return Daemon.objects.get(), inv


def test_a_slurm_job_that_ends_under_its_daemon_marks_it_lost_at_once_and_the_work_reruns(
    hpc, slurm_cluster
):
    first, inv = _one_daemon_running_a_sleep(3)

    # kill -9 of the daemon inside the job (an OOM kill, a crash): it cannot say goodbye,
    # and its job ends FAILED
    subprocess.run(["pkill", "-KILL", "-f", "--", f"--name {first.name}"], check=True)
    wait_for(lambda: first.external_id not in slurm_cluster.jobs(), what="the job to end")
    event = _tick("gpu")  # no heartbeat timeout (600 s here): Slurm's word is enough
    first.refresh_from_db()
    assert first.state == "lost"
    lost = QueueEvent.objects.get(action="daemon_lost")
    assert f"slurm job {first.external_id} ended: FAILED" in lost.reason
    assert (lost.daemons, lost.pending, lost.delta) == (0, 1, -1)  # the signals after it
    assert ApiToken.objects.get(pk=first.token_id).revoked_at is not None
    inv.refresh_from_db()
    assert (inv.state, inv.attempts) == ("queued", 1)
    assert "daemon lost" in inv.error

    # the same tick saw one daemon fewer than wanted and launched a replacement
    assert (event.action, event.delta) == ("scale_up", 1)
    wait_for(lambda: Invocation.objects.get(pk=inv.pk).state == "succeeded", what="the rerun")
    inv.refresh_from_db()
    assert inv.attempts == 2 and inv.daemon_id != first.pk


def test_an_external_scancel_ends_the_daemon_and_its_job_reruns(hpc, slurm_cluster):
    """scancel's SIGTERM reaches the daemon and its job process at once: the job's death
    is not reported as the invocation's failure; the daemon leaves, the server requeues
    the work, and the next tick replaces the daemon."""
    first, inv = _one_daemon_running_a_sleep(60)
    slurm_cluster.run("scancel", first.external_id)
    wait_for(lambda: first.external_id not in slurm_cluster.jobs(), what="the job to end")
    event = _tick("gpu")
    first.refresh_from_db()
    assert first.state in ("terminated", "lost")  # it left, or Slurm's word came first
    inv.refresh_from_db()
    assert (inv.state, inv.attempts) == ("queued", 1), inv.error
    log = Path(first.log_path).read_text()
    assert "stopped by SIGTERM from outside" in log, log
    assert (event.action, event.delta) == ("scale_up", 1)
    inv.max_attempts = 2  # the rerun: a short one this time
    Invocation.objects.filter(pk=inv.pk).update(args=[0.2])
    wait_for(lambda: Invocation.objects.get(pk=inv.pk).state == "succeeded", what="the rerun")


def test_a_bad_partition_is_a_launch_failed_event_with_slurms_words_then_back_off(
    hpc, slurm_cluster
):
    hpc.config = {"partition": "nope", "slurm_conf": slurm_cluster.conf}
    hpc.save()
    builders.queue(name="bad", provider="hpc", elasticity_spec={"kind": "fixed", "min": 1})
    before = timezone.now()
    _tick("bad")
    failed = QueueEvent.objects.get(action="launch_failed")
    assert "invalid partition" in failed.reason.lower(), failed.reason
    assert "backing off" in failed.reason
    queue = Queue.objects.get(name="bad")
    assert queue.launch_failures == 1 and queue.launch_backoff_until > before
    daemon = Daemon.objects.get()
    assert daemon.state == "terminated" and daemon.external_id == ""
    assert ApiToken.objects.get(pk=daemon.token_id).revoked_at is not None
    assert not ours(slurm_cluster, "bad")

    again = _tick("bad")  # backing off: no new launch, and it says so
    assert again.action == "hold" or again.action == "tick_noop"
    assert "failed launch" in again.reason and "next try at" in again.reason
    assert Daemon.objects.count() == 1


def test_a_job_pending_past_the_start_up_grace_is_cancelled_and_counted_as_failed(
    hpc, slurm_cluster, settings
):
    settings.LAKESHORE_STARTUP_GRACE = 1
    hpc.config = {"partition": "debug", "cpus_per_task": 64, "slurm_conf": slurm_cluster.conf}
    hpc.save()  # more CPUs than the node has: Slurm accepts it and leaves it pending
    builders.queue(name="big", provider="hpc", elasticity_spec={"kind": "fixed", "min": 1})
    _tick("big")
    wait_for(lambda: Daemon.objects.exclude(external_id="").exists(), what="the job id")
    daemon = Daemon.objects.get()
    assert ours(slurm_cluster, "big")[daemon.external_id][1] == "PENDING"
    time.sleep(1.2)
    _tick("big")
    failed = QueueEvent.objects.get(action="launch_failed")
    assert f"slurm job {daemon.external_id} still pending" in failed.reason
    assert "cancelled" in failed.reason and "backing off" in failed.reason
    daemon.refresh_from_db()
    assert daemon.state == "terminated"
    wait_for(lambda: not ours(slurm_cluster, "big"), what="the pending job to be cancelled")


def test_providers_show_says_whether_the_cluster_answers_and_lists_its_jobs(
    hpc, slurm_cluster, live_server, tmp_path
):
    builders.queue(name="train", provider="hpc", elasticity_spec={"kind": "fixed", "min": 1})
    _tick("train")
    wait_for(lambda: Daemon.objects.exclude(external_id="").exists(), what="the job id")
    daemon = Daemon.objects.get()
    controller.tick()  # the tick observes the cluster; a read shows what it saw
    out = _cli(live_server, tmp_path, "providers", "show", "hpc")
    assert out.returncode == 0, out.stderr
    assert "Cluster: reachable" in out.stdout
    assert "debug" in out.stdout and "PARTITION" in out.stdout
    assert "Slurm jobs: 1" in out.stdout
    row = next(line for line in out.stdout.splitlines() if line.startswith(daemon.external_id))
    assert f"lakeshore-train-{daemon.pk}" in row and row.split()[-1] == str(daemon.pk)

    missing = f"{slurm_cluster.dir}/nonexistent.conf"
    hpc.config = {"slurm_conf": missing}
    hpc.save()
    controller.tick()  # the tick observes the cluster; a read shows what it saw
    out = _cli(live_server, tmp_path, "providers", "show", "hpc")
    assert out.returncode == 0, out.stderr
    assert f"unreachable: SLURM_CONF {missing} is not a file" in out.stdout


def test_without_slurm_conf_the_servers_environment_finds_the_cluster(
    hpc, slurm_cluster, monkeypatch
):
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.conf)
    hpc.config = {"partition": "debug"}
    hpc.save()
    builders.queue(name="env", provider="hpc", elasticity_spec={"kind": "fixed", "min": 1})
    _tick("env")
    wait_for(lambda: Daemon.objects.filter(state="idle").exists(), what="the daemon")
    assert list(ours(slurm_cluster, "env").values())[0][1] == "RUNNING"


def test_an_instance_type_maps_onto_the_jobs_resources(hpc, slurm_cluster):
    hpc.config = {
        "partition": "debug",
        "slurm_conf": slurm_cluster.conf,
        "instance_types": {"cpu2": {"cpus_per_task": 2, "mem": "100M", "time_limit": "10"}},
    }
    hpc.save()
    builders.queue(
        name="sized",
        provider="hpc",
        instance_type="cpu2",
        elasticity_spec={"kind": "fixed", "min": 1},
    )
    _tick("sized")
    wait_for(lambda: Daemon.objects.exclude(external_id="").exists(), what="the job id")
    daemon = Daemon.objects.get()
    shown = slurm_cluster.run("scontrol", "show", "job", daemon.external_id)
    assert "NumCPUs=2" in shown and "TimeLimit=00:10:00" in shown
    assert "MinMemoryNode=100M" in shown and "Partition=debug" in shown
    assert daemon.instance_type == "cpu2"


def test_a_server_without_slurm_conf_says_how_to_point_it_at_the_cluster(
    slurm_cluster, monkeypatch
):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    provider = builders.provider(name="hpc", kind="slurm", config={"partition": "debug"})
    providers_observe(now=timezone.now())  # the tick observes; a read shows what it saw
    provider.refresh_from_db()
    status = provider_status(provider)
    assert status["reachable"] is False
    assert "sinfo failed" in status["error"]
    assert 'no SLURM_CONF in its environment and the provider no "slurm_conf"' in status["error"]
