"""A real Celery worker with beat (-B) runs the reaper on its tick against the database."""

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from fleet.models import Daemon
from jobs import services
from queues.models import QueueEvent
from tests.support import builders
from tests.support.servers import database_url
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
BROKERS = ["filesystem://"]
if os.environ.get("LAKESHORE_TEST_REDIS_URL"):  # .ci/run starts a Redis server
    BROKERS.append(os.environ["LAKESHORE_TEST_REDIS_URL"])


def _start_worker(tmp_path, broker):
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "lakeshore_admin.settings",
        "LAKESHORE_VAR_DIR": str(tmp_path / "var"),
        "LAKESHORE_TICK_SECONDS": "1",
        "LAKESHORE_BROKER_URL": broker,
        "PYTHONWARNINGS": "ignore",
    }
    log = open(tmp_path / "celery.log", "w")  # noqa: SIM115 - lives as long as the worker
    return subprocess.Popen(
        [
            str(Path(sys.executable).parent / "celery"),
            "-A",
            "lakeshore_admin",
            "worker",
            "-B",
            "--pool=solo",
            "--loglevel=info",
            f"--hostname=test-{os.getpid()}@%h",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.parametrize("broker", BROKERS)
def test_beat_reaps_a_silent_daemon_on_its_tick(tmp_path, broker):
    builders.queue(name="w")
    inv, _ = services.invocation_submit(function="x.y", queue="w", max_attempts=2)
    daemon = builders.daemon(queues=["w"], last_heartbeat_at=timezone.now())
    builders.claim(daemon=daemon)
    Daemon.objects.filter(pk=daemon.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=120)
    )
    worker = _start_worker(tmp_path, broker)
    try:
        wait_for(
            lambda: Daemon.objects.get(pk=daemon.pk).state == "lost",
            timeout=40,
            what="beat's reaper tick",
        )
    finally:
        worker.terminate()
        worker.wait(20)
    inv.refresh_from_db()
    assert (inv.state, inv.daemon_id) == ("queued", None)
    text = (tmp_path / "celery.log").read_text()
    assert "fleet.reap" in text and "'lost': 1" in text


@pytest.mark.parametrize("broker", BROKERS)
def test_beat_runs_the_elasticity_controller(tmp_path, broker):
    builders.provider(name="sim", kind="simulated")
    builders.queue(name="train", provider="sim", elasticity_spec={"kind": "fixed", "min": 2})
    worker = _start_worker(tmp_path, broker)
    try:
        wait_for(
            lambda: QueueEvent.objects.filter(queue__name="train", action="scale_up").exists(),
            timeout=40,
            what="the controller's first tick",
        )
    finally:
        worker.terminate()
        worker.wait(20)
    assert Daemon.objects.live().subscribed_to("train").count() == 2
