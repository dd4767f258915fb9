"""/api/v1/daemons/ — register, list and show daemons."""

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from fleet.api.serializers import DaemonSerializer
from fleet.models import Daemon, DaemonState
from jobs.models import Invocation
from tests.support import builders
from tests.support.assertions import assert_error
from tests.support.shapes import DAEMON_KEYS

pytestmark = pytest.mark.django_db

REGISTER = "/api/v1/daemons/register/"
URL = "/api/v1/daemons/"


@pytest.fixture
def daemon_client():
    client = APIClient()
    client.credentials(**builders.auth(builders.token("daemon", username="robot")))
    return client


def register(client, **body):
    return client.post(REGISTER, body, format="json")


def test_a_daemon_token_registers_a_daemon(daemon_client):
    builders.queue(name="train")
    builders.queue(name="eval")

    response = register(
        daemon_client, name="worker-1", queues=["train", "eval"], instance_type="p4d"
    )

    assert response.status_code == 201, response.json()
    body = response.json()
    assert set(body) == DAEMON_KEYS | {"token", "heartbeat_timeout"}
    assert body["heartbeat_timeout"] == settings.LAKESHORE_HEARTBEAT_TIMEOUT  # to beat within
    daemon = Daemon.objects.get()
    assert body["token"].startswith("lsk_") and daemon.token.bound  # its own credential
    assert body["id"] == str(daemon.pk)
    assert body["name"] == "worker-1"
    assert body["queues"] == ["train", "eval"]
    assert body["state"] == "idle"
    assert body["provider"] is None  # only a provider's own launch credential names one
    assert body["instance_type"] == "p4d"
    assert body["current_invocation"] is None
    assert body["last_heartbeat_at"].endswith("Z")
    assert daemon.owner.username == "robot"


def test_an_operator_registers_a_daemon(operator):
    builders.queue(name="train")

    response = register(operator, name="worker-1", queues=["train"])

    assert response.status_code == 201
    assert Daemon.objects.get().queues == ["train"]


@pytest.mark.parametrize("body", [{"queues": []}, {}])
def test_no_queues_means_the_default_queue(daemon_client, body):
    response = register(daemon_client, name="worker-1", **body)

    assert response.status_code == 201
    assert response.json()["queues"] == []


def test_repeated_queue_names_count_once(daemon_client):
    builders.queue(name="train")

    response = register(daemon_client, name="w", queues=["train", "train"])

    assert response.json()["queues"] == ["train"]


def test_it_refuses_unknown_queues_and_names_them(daemon_client):
    builders.queue(name="train")

    response = register(daemon_client, name="w", queues=["train", "ghost", "phantom"])

    assert_error(response, 400, "invalid", field="queues", says=["ghost", "phantom"])
    assert not Daemon.objects.exists()


@pytest.mark.parametrize("queues", [["Train"], ["ok", "bad_name"], ["x" * 64], "train"])
def test_it_refuses_bad_queue_names(daemon_client, queues):
    response = register(daemon_client, name="w", queues=queues)

    error = assert_error(response, 400, "invalid")
    assert any(field.startswith("queues") for field in error["fields"]), error
    assert not Daemon.objects.exists()


@pytest.mark.parametrize("body, field", [({"name": ""}, "name"), ({}, "name")])
def test_it_refuses_a_missing_daemon_name(daemon_client, body, field):
    response = register(daemon_client, **body)

    assert_error(response, 400, "invalid", field=field)


def test_it_refuses_more_than_64_queues(daemon_client):
    names = [f"q{index}" for index in range(65)]
    for name in names:
        builders.queue(name=name)

    response = register(daemon_client, name="w", queues=names)

    assert_error(response, 400, "invalid", field="queues", says="64")
    assert register(daemon_client, name="w", queues=names[:64]).status_code == 201


def test_a_bootstrap_token_may_not_name_a_provider_known_or_not(daemon_client):
    builders.provider(name="gpu-cloud")
    for provider in ("gpu-cloud", "nope"):
        response = register(daemon_client, name="w", provider=provider)

        assert_error(response, 403, "provider_not_yours", field="provider", says=provider)
    assert not Daemon.objects.exists()


def test_a_viewer_may_not_register(viewer):
    response = register(viewer, name="w")

    assert_error(response, 403, "permission_denied", says="daemon or operator")
    assert not Daemon.objects.exists()


def test_it_lists_daemons_newest_first(operator):
    old = builders.daemon()
    new = builders.daemon(state=DaemonState.BUSY)

    response = operator.get(URL)

    assert response.status_code == 200
    assert [d["id"] for d in response.json()] == [str(new.pk), str(old.pk)]
    assert set(response.json()[0]) == DAEMON_KEYS


def test_it_filters_by_queue(operator):
    builders.queue(name="train")
    mine = builders.daemon(queues=["eval", "train"])
    builders.daemon(queues=["train-big"])
    builders.daemon(queues=[])

    response = operator.get(URL, {"queue": "train"})

    assert [d["id"] for d in response.json()] == [str(mine.pk)]


def test_it_filters_by_state(operator):
    idle = builders.daemon(state=DaemonState.IDLE)
    busy = builders.daemon(state=DaemonState.BUSY)
    builders.daemon(state=DaemonState.LOST)

    only_idle = operator.get(URL, {"state": "idle"}).json()
    both = operator.get(f"{URL}?state=idle&state=busy").json()

    assert [d["id"] for d in only_idle] == [str(idle.pk)]
    assert [d["id"] for d in both] == [str(busy.pk), str(idle.pk)]


def test_it_refuses_an_unknown_state(operator):
    response = operator.get(URL, {"state": "asleep"})

    assert_error(response, 400, "invalid", field="state", says="asleep")


def test_it_pages_the_list(operator):
    for _ in range(3):
        builders.daemon()

    response = operator.get(URL, {"limit": 2})

    assert len(response.json()) == 2
    assert 'rel="next"' in response["Link"]
    assert_error(operator.get(URL, {"limit": 1001}), 400, "invalid", field="limit")


def test_it_shows_a_daemon(operator):
    gpu = builders.provider(name="gpu-cloud")
    daemon = builders.daemon(queues=["a"], provider=gpu, instance_type="p4d")

    response = operator.get(f"{URL}{daemon.pk}/")

    assert response.status_code == 200
    body = response.json()
    assert set(body) == DAEMON_KEYS
    assert body["id"] == str(daemon.pk)
    assert (body["queues"], body["provider"], body["instance_type"]) == (["a"], "gpu-cloud", "p4d")


@pytest.mark.parametrize("daemon_id", ["999999", "abc", "1.5", "99999999999999999999999"])
def test_it_answers_404_for_an_unknown_daemon(operator, daemon_id):
    response = operator.get(f"{URL}{daemon_id}/")

    assert_error(response, 404, "not_found", says=daemon_id)


def test_it_runs_the_same_number_of_queries_for_1_and_50_daemons(operator):
    gpu = builders.provider()
    builders.daemon(queues=["a"], provider=gpu)
    operator.get(URL)  # the first request of a token also stamps its last use

    with CaptureQueriesContext(connection) as one:
        assert len(operator.get(URL).json()) == 1
    for _ in range(49):
        builders.daemon(queues=["a", "b"], provider=gpu)
    with CaptureQueriesContext(connection) as fifty:
        assert len(operator.get(URL).json()) == 50

    assert len(fifty) == len(one)


def test_a_daemon_loaded_without_the_list_query_still_shows_what_it_runs():
    """The serializer reads the current invocation itself for a daemon that was not
    loaded through Daemon.objects.for_list() (which annotates it)."""
    daemon = builders.daemon(state=DaemonState.BUSY)
    Invocation.objects.create(function="m.f", state="succeeded", daemon=daemon)
    running = Invocation.objects.create(function="m.f", state="running", daemon=daemon)
    Invocation.objects.create(function="m.f", state="queued")

    plain = Daemon.objects.get(pk=daemon.pk)
    listed = Daemon.objects.for_list().get(pk=daemon.pk)
    assert DaemonSerializer(plain).data["current_invocation"] == str(running.pk)
    assert DaemonSerializer(listed).data == DaemonSerializer(plain).data
