"""The controller's tick over many queues of one Slurm provider asks `squeue` once for
all of them (fleet/slurm.py, observe_queues), outside the tick's transaction, and still
judges each queue's daemons by its own jobs."""

import time

import pytest
from django.utils import timezone

from fleet import controller
from fleet.models import Daemon
from fleet.slurm import SlurmCommands
from queues.models import QueueEvent
from tests.support import builders

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db,
    pytest.mark.xdist_group("slurm"),  # one cluster per test process: keep them on one
    pytest.mark.slurm,
]


@pytest.fixture
def cluster(slurm_cluster, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.LAKESHORE_SLURM_CONF_DIRS = [str(slurm_cluster.dir)]
    settings.LAKESHORE_STARTUP_GRACE = 60
    settings.LAKESHORE_HEARTBEAT_TIMEOUT = 600
    slurm_cluster.cancel_all()
    yield slurm_cluster
    slurm_cluster.cancel_all()


def test_one_squeue_for_all_of_a_providers_queues(cluster, monkeypatch):
    provider = builders.provider(
        name="hpc", kind="slurm", config={"partition": "debug", "slurm_conf": cluster.conf}
    )
    daemons = {}
    for name in ("a", "b", "c"):  # c: no daemon, nothing to ask
        builders.queue(name=name, provider="hpc", elasticity_spec={"kind": "fixed", "min": 0})
    for name in ("a", "b"):  # a daemon each, in a job of its own (as if just launched)
        out = cluster.run(
            "sbatch", "--parsable", "--partition=debug", "--output=/dev/null", "--wrap", "sleep 120"
        )  # no slurm-N.out where the tests run
        daemons[name] = builders.daemon(
            queues=[name], state="provisioning", provider=provider,
            external_id=out.strip().split(";")[0], last_heartbeat_at=timezone.now(),
        )  # fmt: skip
    asked: list[list[str]] = []
    squeue = SlurmCommands.squeue
    monkeypatch.setattr(
        SlurmCommands, "squeue", lambda self, ids: asked.append(sorted(ids)) or squeue(self, ids)
    )

    controller.tick()

    assert asked == [sorted(d.external_id for d in daemons.values())]
    assert set(Daemon.objects.values_list("state", flat=True)) == {"provisioning"}

    cluster.run("scancel", daemons["a"].external_id)
    deadline = time.monotonic() + 30
    while daemons["a"].external_id in cluster.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)
    controller.tick()

    assert len(asked) == 2
    assert Daemon.objects.get(pk=daemons["a"].pk).state == "lost"
    assert Daemon.objects.get(pk=daemons["b"].pk).state == "provisioning"
    lost = QueueEvent.objects.get(action="daemon_lost")
    assert lost.queue.name == "a" and daemons["a"].external_id in lost.reason
