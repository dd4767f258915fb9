"""Issue 29, items 7 and 8, once each through make run's server (gunicorn with uvicorn
workers, against the test database): an operator's token mints no token for `admin`,
and a daemon's own credential polls no new SDK worker into being. The controls: the
operator's own token, and a bootstrap token's poll. The rules' every case is in
tests/accounts/test_token_ownership.py and tests/fleet/test_daemon_registration.py."""

import httpx
import msgpack
import pytest
from django.contrib.auth import get_user_model

from accounts.models import ApiToken
from accounts.services import token_create
from fleet.models import Daemon
from tests.support import builders
from tests.support.sdk_wire import answer_of
from tests.support.servers import environment, gunicorn

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.security]


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker, tmp_path_factory):
    """One server for the module; each test's rows are committed, so it sees them."""
    var = tmp_path_factory.mktemp("principals")
    with django_db_blocker.unblock():
        env = environment(var)
    with gunicorn(var, env) as (base, _):
        yield base


def _as(raw: str) -> dict:
    return {"Authorization": f"Bearer {raw}"}


def test_an_operator_mints_no_token_for_admin_through_the_server(server):
    get_user_model().objects.create_superuser(username="admin", email="", password="x")  # noqa: S106
    _, mallory = token_create(username="mallory", role="operator")
    with httpx.Client(base_url=server, timeout=30) as client:
        refused = client.post(
            "/api/v1/tokens/", json={"user": "admin", "role": "operator"}, headers=_as(mallory)
        )
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "not_your_token")
        assert not ApiToken.objects.filter(user__username="admin").exists()
        own = client.post(
            "/api/v1/tokens/", json={"user": "mallory", "role": "viewer"}, headers=_as(mallory)
        )
        assert (own.status_code, own.json()["user"]) == (201, "mallory")


def _poll(client: httpx.Client, raw: str, worker_id: str) -> httpx.Response:
    body = msgpack.packb({"worker_id": worker_id, "queue": "w", "timeout_s": 0})
    headers = {**_as(raw), "Content-Type": "application/x-msgpack"}
    return client.post("/v1/daemon/poll", content=body, headers=headers)


def test_a_daemons_credential_polls_no_new_worker_through_the_server(server):
    builders.queue(name="w")
    _, bootstrap = token_create(username="robots", role="daemon")
    with httpx.Client(base_url=server, timeout=30) as client:
        one = client.post(
            "/api/v1/daemons/register/",
            json={"name": "one", "queues": ["w"]},
            headers=_as(bootstrap),
        )
        assert one.status_code == 201, one.text
        refused = _poll(client, one.json()["token"], "host-a")
        assert (refused.status_code, answer_of(refused)["error"]["code"]) == (
            403,
            "not_your_daemon",
        )
        assert not Daemon.objects.filter(worker_id="host-a").exists()
        admitted = _poll(client, bootstrap, "host-a")  # control: the bootstrap token may
        assert (admitted.status_code, answer_of(admitted)) == (200, {"commands": []})
        assert Daemon.objects.filter(worker_id="host-a").exists()
