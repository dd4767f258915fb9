"""The `local` provider starts real `lakeshore daemon run` processes, which register into
the rows it made, run work, and leave when the controller scales down."""

import pytest
from rest_framework.test import APIClient

from accounts.models import ApiToken
from fleet.driver_base import DRIVERS
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from queues.services import queue_patch
from tests.support import builders
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def local_provider(live_server, settings, tmp_path):
    settings.LAKESHORE_PUBLIC_URL = live_server.url
    settings.VAR_DIR = tmp_path
    settings.LAKESHORE_STARTUP_GRACE = 0
    settings.LAKESHORE_SCALE_DOWN_WINDOW = 0
    yield builders.provider(name="here", kind="local", config={"concurrency": 1})
    for process in DRIVERS["local"].processes.values():  # never leave one behind
        if process.poll() is None:
            process.kill()
            process.wait(10)
    DRIVERS["local"].processes.clear()


def services_status(name: str) -> dict:
    """What `lakeshore providers show NAME` prints from: the API's status (it may be
    served by another process than the one that started the daemons)."""
    client = APIClient()
    client.credentials(**builders.auth(builders.token("viewer")))
    return client.get(f"/api/v1/providers/{name}/").json()["status"]


def test_it_starts_a_daemon_that_runs_work_and_stops_it_on_scale_down(local_provider, tmp_path):
    queue = builders.queue(
        name="train", provider="here", elasticity_spec={"kind": "fixed", "min": 1}
    )
    up = builders.tick_queue(queue.pk)
    assert (up.action, up.delta) == ("scale_up", 1)
    daemon = Daemon.objects.get()
    wait_for(
        lambda: Daemon.objects.get(pk=daemon.pk).state == "idle",
        what="the launched daemon to register",
    )
    assert Daemon.objects.count() == 1  # it registered into the provider's row
    process = DRIVERS["local"].processes[daemon.pk]
    shown = services_status("here")
    assert shown == {"processes": [{"daemon": str(daemon.pk), "pid": process.pid, "running": True}]}

    inv, _ = services.invocation_submit(
        function="lakeshore.functions.echo", queue="train", args=["from a local daemon"]
    )
    wait_for(lambda: Invocation.objects.get(pk=inv.pk).state == "succeeded", what="the job")
    inv.refresh_from_db()
    assert inv.daemon_id == daemon.pk and inv.result["args"] == ["from a local daemon"]

    queue_patch(name="train", changes={"elasticity": {"min": 0}})
    down = builders.tick_queue(queue.pk)
    assert (down.action, down.delta) == ("scale_down", -1)
    code = process.wait(20)
    log = (tmp_path / "log" / "daemons" / f"{daemon.name}.log").read_text()
    assert code == 0, log
    assert Daemon.objects.get(pk=daemon.pk).state == "terminated"
    token = ApiToken.objects.get(name=f"daemon {daemon.name}")
    assert token.revoked_at is not None
    assert "registered daemon" in log and "succeeded" in log


def test_a_daemon_it_starts_runs_the_python_sdks_calls_too(local_provider, settings):
    """The controller's fleet serves both kinds of job: an @dls.udf call submitted with
    the real SDK runs on a daemon the local provider started."""
    dls = pytest.importorskip("dreamlake.lakeshore")
    from tests.support import sdk_udfs  # noqa: PLC0415 - needs the optional dreamlake SDK: after the importorskip

    settings.LAKESHORE_ALLOWED_MODULES = ["tests.support.sdk_udfs"]  # the server owner's word
    queue = builders.queue(name="gpu", provider="here", elasticity_spec={"kind": "fixed", "min": 1})
    builders.tick_queue(queue.pk)
    dp = dls.HttpDispatch(settings.LAKESHORE_PUBLIC_URL, token=builders.token("operator"))
    try:
        inv = sdk_udfs.add.submit(40, 2, _dispatch=dp)
        assert dls.SyncQueue("gpu", dispatch=dp).result(inv, timeout=60) == {
            "sum": 42,
            "pair": (40, 2),
        }
    finally:
        dp.close()
    assert Invocation.objects.get(pk=int(inv)).daemon_id == Daemon.objects.get().pk
