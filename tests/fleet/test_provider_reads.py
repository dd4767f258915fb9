"""Issue 29, item 6: a viewer's `GET /api/v1/providers/<slurm>/` ran `sinfo` and `squeue`
on every request, each up to LAKESHORE_SLURM_TIMEOUT (30 s): any token could keep the
server's threads in shell-outs. Now the controller's tick observes the cluster and
stores what it saw, with its time, on the provider; a read shows that and runs nothing.

Slurm's client commands are stand-ins first on PATH that record each call (the boundary:
what the server asks of Slurm); tests/fleet/test_slurm_provider.py runs the real ones
against a real cluster."""

import os
import stat
import textwrap
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from fleet import controller
from fleet.models import Provider
from tests.support import builders
from tests.support.servers import environment, gunicorn

pytestmark = [pytest.mark.django_db, pytest.mark.security]

FAKE = """\
    #!/bin/sh
    echo "$(basename "$0")" >> {calls}
    if [ -e {down} ]; then
        echo "slurm_load_partitions: Unable to contact slurm controller" >&2
        exit 1
    fi
    case "$(basename "$0")" in
        sinfo) echo "debug*|up|1|idle|0/4/0/4" ;;
        squeue) echo "4242|lakeshore-train-1|RUNNING|None|0:05" ;;
    esac
"""


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """sinfo and squeue stand-ins; `slurm.calls()` lists the commands run so far, and
    `slurm.down()` makes them fail as a cluster that does not answer."""
    bin_dir, calls, down = tmp_path / "bin", tmp_path / "calls", tmp_path / "down"
    bin_dir.mkdir()
    for name in ("sinfo", "squeue"):
        fake = bin_dir / name
        fake.write_text(textwrap.dedent(FAKE).format(calls=calls, down=down))
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)

    class Slurm:
        @staticmethod
        def calls() -> list[str]:
            return calls.read_text().split() if calls.exists() else []

        @staticmethod
        def down() -> None:
            down.touch()

    return Slurm


@pytest.fixture
def viewer():
    client = APIClient()
    client.credentials(**builders.auth(builders.token("viewer")))
    return client


def _status(viewer) -> dict:
    answer = viewer.get("/api/v1/providers/hpc/")
    assert answer.status_code == 200, answer.content
    return answer.json()["status"]


def test_a_viewers_reads_run_no_subprocess_and_show_what_the_tick_observed(slurm, viewer):
    builders.provider(name="hpc", kind="slurm", config={"partition": "debug"})

    before = [_status(viewer) for _ in range(3)]

    assert slurm.calls() == []  # the attack: three reads, no sinfo, no squeue
    assert before[0] == {
        "reachable": None,
        "error": "",
        "partitions": [],
        "jobs": [],
        "observed_at": None,
    }
    at = timezone.now()
    controller.tick(now=at)  # control: the tick does ask the cluster
    assert slurm.calls() == ["sinfo", "squeue"]
    seen = _status(viewer)
    assert slurm.calls() == ["sinfo", "squeue"]  # and the read after it asks nothing
    assert seen["reachable"] is True and seen["error"] == ""
    assert seen["partitions"] == [
        {"partition": "debug*", "avail": "up", "nodes": "1", "state": "idle", "cpus": "0/4/0/4"}
    ]
    assert seen["observed_at"] == at.isoformat().replace("+00:00", "Z")


def test_a_failing_sinfo_is_a_failed_observation_with_its_error_and_time(slurm, viewer):
    builders.provider(name="hpc", kind="slurm", config={"partition": "debug"})
    builders.queue(name="train", provider="hpc", elasticity_spec={"kind": "fixed", "min": 0})
    at = timezone.now()
    controller.tick(now=at)
    slurm.down()

    later = at + timedelta(seconds=10)
    report = controller.tick(now=later)  # it does not raise: the tick goes on

    assert report["providers"] == 1
    seen = _status(viewer)
    assert seen["reachable"] is False
    assert (
        "sinfo failed: slurm_load_partitions: Unable to contact slurm controller" in (seen["error"])
    )
    assert seen["observed_at"] == later.isoformat().replace("+00:00", "Z")
    assert seen["partitions"] == []  # what it saw before is not shown as current


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_reads_through_make_runs_server_run_nothing(slurm, tmp_path):
    """The same through `make run`'s gunicorn and uvicorn workers, whose PATH finds the
    stand-ins: twenty reads at once run no command; after a tick they show its answer."""
    builders.provider(name="hpc", kind="slurm", config={"partition": "debug"})
    auth = {"Authorization": f"Bearer {builders.token('viewer')}"}
    with gunicorn(tmp_path, environment(tmp_path / "var")) as (base, _):

        def read(_=None) -> dict:
            answer = httpx.get(f"{base}/api/v1/providers/hpc/", headers=auth, timeout=30)
            assert answer.status_code == 200, answer.text
            return answer.json()["status"]

        with ThreadPoolExecutor(20) as pool:
            before = list(pool.map(read, range(20)))
        assert slurm.calls() == []
        assert {status["reachable"] for status in before} == {None}
        controller.tick()  # control: the tick asks, and the server shows what it said
        after = read()
    assert slurm.calls() == ["sinfo", "squeue"]
    assert after["reachable"] is True and after["partitions"][0]["partition"] == "debug*"


@pytest.mark.django_db(transaction=True)
def test_providers_show_says_what_was_observed_and_when(slurm, sh):  # noqa: F811
    builders.provider(name="hpc", kind="slurm", config={"partition": "debug"})
    assert "Cluster: not observed yet" in sh("lakeshore providers show hpc").stdout
    controller.tick(now=timezone.now().replace(microsecond=0))
    at = Provider.objects.get(name="hpc").observed_at.strftime("%Y-%m-%dT%H:%M:%SZ")

    shown = sh("lakeshore providers show hpc").stdout
    slurm.down()
    controller.tick(now=timezone.now() + timedelta(seconds=10))
    failed = sh("lakeshore providers show hpc").stdout

    assert f"Cluster: reachable, observed {at}" in shown and "debug*" in shown
    assert "Cluster: unreachable: sinfo failed: slurm_load_partitions" in failed
    assert slurm.calls() == ["sinfo", "squeue", "sinfo"]  # the ticks' only: no show ran one
