"""Code execution belongs to the server's owner. The exploit: an operator token creates
a `local` provider whose config sets `allowed_modules` to `os,subprocess`, puts a queue
on it and submits `os.system`. It must fail end to end: the API refuses the config, and
even a config forced into the row widens nothing — the daemons the provider starts get
only the server's LAKESHORE_ALLOWED_MODULES, and refuse the job."""

import httpx
import pytest

from fleet.daemons import daemon_drop
from fleet.driver_base import DRIVERS
from fleet.models import Daemon, Provider
from jobs.models import Invocation
from tests.support import builders
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WIDENING = {"allowed_modules": "os,subprocess"}


@pytest.fixture
def api(live_server):
    """An operator, over real HTTP, as the exploit would come."""
    headers = {"Authorization": f"Bearer {builders.token('operator')}"}
    with httpx.Client(base_url=f"{live_server.url}/api/v1/", headers=headers) as client:
        yield client


@pytest.fixture
def local_daemons(live_server, settings, tmp_path):
    """Daemons the local provider starts talk to the live server; none outlives the test."""
    settings.LAKESHORE_PUBLIC_URL = live_server.url
    settings.VAR_DIR = tmp_path
    settings.LAKESHORE_STARTUP_GRACE = 0
    settings.LAKESHORE_ALLOWED_MODULES = []  # the server's owner allows nothing extra
    yield DRIVERS["local"].processes
    for daemon in Daemon.objects.live().filter(provider__kind="local"):
        daemon_drop(daemon=daemon)  # SIGTERM after commit: it stops and leaves
    for process in DRIVERS["local"].processes.values():
        try:
            process.wait(20)
        except Exception:  # noqa: BLE001 - never leave one behind
            process.kill()
            process.wait(10)
    DRIVERS["local"].processes.clear()


def test_the_api_refuses_a_config_that_names_allowed_modules(api):
    response = api.post("providers/", json={"name": "here", "kind": "local", "config": WIDENING})

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert "unknown key" in error["fields"]["config.allowed_modules"]
    assert not Provider.objects.exists()
    patched = builders.provider(name="here", kind="local")
    response = api.patch("providers/here/", json={"config": WIDENING})
    assert response.status_code == 400, response.text
    patched.refresh_from_db()
    assert patched.config == {}


def test_a_forced_config_widens_nothing_and_os_system_does_not_run(api, local_daemons, tmp_path):
    builders.provider(name="here", kind="local", config={"concurrency": 1})
    Provider.objects.filter(name="here").update(config={**WIDENING, "concurrency": 1})
    queue = builders.queue(name="pwn", provider="here", elasticity_spec={"kind": "fixed", "min": 1})

    up = builders.tick_queue(queue.pk)

    assert (up.action, up.delta) == ("scale_up", 1)
    daemon = Daemon.objects.get()
    wait_for(
        lambda: Daemon.objects.get(pk=daemon.pk).state == "idle",
        what="the launched daemon to register",
    )
    assert daemon.pk in local_daemons  # a real process, started by the provider
    marker = tmp_path / "pwned"
    response = api.post(
        "jobs/", json={"function": "os.system", "queue": "pwn", "args": [f"touch {marker}"]}
    )
    assert response.status_code == 201, response.text  # a public path: the daemon decides
    job = Invocation.objects.get(pk=response.json()["id"])
    wait_for(lambda: Invocation.objects.get(pk=job.pk).state == "failed", what="the refusal")
    job.refresh_from_db()
    assert job.daemon_id == daemon.pk
    assert "not in an allowed module" in job.error
    assert "this daemon runs lakeshore.functions (" in job.error  # and nothing else
    assert not marker.exists()


def test_private_paths_are_refused_before_any_daemon_sees_them(api):
    builders.queue(name="pwn")

    for function in ("os._exit", "lakeshore.functions.__builtins__", "a.__class__.b"):
        response = api.post("jobs/", json={"function": function, "queue": "pwn"})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], list(error["fields"])) == ("invalid", ["function"])
        assert "private or dunder" in error["message"]
    assert not Invocation.objects.exists()
