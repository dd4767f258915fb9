"""/api/v1/providers/ and /api/v1/providers/NAME/ — `lakeshore providers …`."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import Provider
from tests.support import builders
from tests.support.assertions import assert_error
from tests.support.shapes import PROVIDER_KEYS

pytestmark = pytest.mark.django_db

URL = "/api/v1/providers/"


def add(client, **body):
    return client.post(URL, body, format="json")


@pytest.mark.parametrize("kind", ["local", "simulated"])
def test_it_adds_a_provider(operator, kind):
    response = add(operator, name="gpu-cloud", kind=kind, description="the GPUs")

    assert response.status_code == 201
    body = response.json()
    assert set(body) == PROVIDER_KEYS
    assert (body["name"], body["kind"], body["description"]) == ("gpu-cloud", kind, "the GPUs")
    assert body["config"] == {}
    assert body["created_at"].endswith("Z")
    assert Provider.objects.filter(name="gpu-cloud").exists()


def test_it_accepts_a_config_that_names_its_credentials(operator):
    config = {"startup_seconds": 5, "credential_ref": "vault:gpu"}

    response = add(operator, name="gpu-cloud", kind="simulated", config=config)

    assert response.status_code == 201
    assert response.json()["config"] == config


def test_it_refuses_an_unknown_kind(operator):
    response = add(operator, name="gpu-cloud", kind="aws")

    assert_error(response, 400, "invalid", field="kind", says="aws")


@pytest.mark.parametrize("name", ["GPU", "gpu_cloud", "-gpu", "g" * 64])
def test_it_refuses_a_bad_name(operator, name):
    response = add(operator, name=name, kind="local")

    assert_error(response, 400, "invalid", field="name")
    assert not Provider.objects.exists()


def test_it_refuses_a_duplicate(operator):
    builders.provider(name="gpu-cloud")

    response = add(operator, name="gpu-cloud", kind="local")

    assert_error(response, 409, "already_exists", field="name", says="already exists")


@pytest.mark.parametrize("config", [["a"], "text", 3])
def test_it_refuses_a_config_that_is_not_an_object(operator, config):
    response = add(operator, name="gpu-cloud", kind="local", config=config)

    assert_error(response, 400, "invalid", field="config", says="object")


@pytest.mark.parametrize(
    "config, path",
    [
        ({"aws_secret_access_key": "x"}, "config.aws_secret_access_key"),
        ({"auth": {"password": "x"}}, "config.auth.password"),
        ({"api_key": "x"}, "config.api_key"),
        ({"hosts": [{"token": "x"}]}, "config.hosts[0].token"),
    ],
)
def test_it_refuses_credentials_in_config_and_names_the_path(operator, config, path):
    response = add(operator, name="gpu-cloud", kind="local", config=config)

    assert_error(response, 400, "invalid", field=path, says=[path, "credential_ref"])
    assert not Provider.objects.exists()


def test_it_refuses_a_misspelt_field(operator):
    response = add(operator, name="gpu-cloud", kind="local", confg={})

    assert_error(response, 400, "invalid", field="confg", says="unknown field")


def test_it_lists_providers_by_name(operator):
    builders.provider(name="zeta")
    builders.provider(name="alpha", kind="local")

    response = operator.get(URL)

    assert response.status_code == 200
    assert [p["name"] for p in response.json()] == ["alpha", "zeta"]
    assert set(response.json()[0]) == PROVIDER_KEYS


def test_it_pages_the_list(operator):
    for name in ["a", "b", "c"]:
        builders.provider(name=name)

    response = operator.get(URL, {"limit": 2})

    assert [p["name"] for p in response.json()] == ["a", "b"]
    assert 'rel="next"' in response["Link"]
    assert_error(operator.get(URL, {"limit": 0}), 400, "invalid", field="limit")


def test_it_runs_the_same_number_of_queries_for_1_and_50_providers(operator):
    builders.provider()
    operator.get(URL)  # the first request of a token also stamps its last use

    with CaptureQueriesContext(connection) as one:
        assert len(operator.get(URL).json()) == 1
    for _ in range(49):
        builders.provider()
    with CaptureQueriesContext(connection) as fifty:
        assert len(operator.get(URL).json()) == 50

    assert len(fifty) == len(one)


def test_it_shows_a_provider(operator):
    builders.provider(name="gpu-cloud", kind="local", config={"concurrency": 2})

    response = operator.get(f"{URL}gpu-cloud/")

    assert response.status_code == 200
    assert response.json()["kind"] == "local"
    assert response.json()["config"] == {"concurrency": 2}


def test_it_answers_404_for_an_unknown_provider(operator):
    assert_error(operator.get(f"{URL}nope/"), 404, "not_found", says="nope")
    assert_error(operator.patch(f"{URL}nope/", {}, format="json"), 404, "not_found")
    assert_error(operator.delete(f"{URL}nope/"), 404, "not_found")


def test_it_patches_description_and_config(operator):
    builders.provider(name="gpu-cloud", config={"startup_seconds": 1})

    response = operator.patch(
        f"{URL}gpu-cloud/",
        {"description": "now in the US", "config": {"fail": "no", "credential_ref": "v:x"}},
        format="json",
    )

    assert response.status_code == 200
    assert response.json()["description"] == "now in the US"
    assert response.json()["config"] == {"fail": "no", "credential_ref": "v:x"}
    assert Provider.objects.get().config == {"fail": "no", "credential_ref": "v:x"}


def test_it_refuses_credentials_in_a_patched_config(operator):
    builders.provider(name="gpu-cloud", config={"startup_seconds": 1})

    response = operator.patch(
        f"{URL}gpu-cloud/", {"config": {"auth": {"password": "x"}}}, format="json"
    )

    assert_error(response, 400, "invalid", field="config.auth.password")
    assert Provider.objects.get().config == {"startup_seconds": 1}


@pytest.mark.parametrize("field, value", [("name", "renamed"), ("kind", "local")])
def test_name_and_kind_are_immutable(operator, field, value):
    builders.provider(name="gpu-cloud", kind="simulated")

    response = operator.patch(f"{URL}gpu-cloud/", {field: value}, format="json")

    assert_error(response, 400, "invalid", field=field, says="cannot change")
    assert Provider.objects.filter(name="gpu-cloud", kind="simulated").exists()


def test_it_removes_a_provider(operator):
    builders.provider(name="gpu-cloud")

    response = operator.delete(f"{URL}gpu-cloud/")

    assert response.status_code == 204
    assert not response.content
    assert not Provider.objects.exists()
    assert_error(operator.get(f"{URL}gpu-cloud/"), 404, "not_found")


def test_it_refuses_to_remove_a_provider_that_queues_use_and_names_them(operator):
    builders.provider(name="gpu-cloud")
    builders.queue(name="train", provider="gpu-cloud")
    builders.queue(name="eval", provider="gpu-cloud")
    builders.queue(name="cpu")

    response = operator.delete(f"{URL}gpu-cloud/")

    error = assert_error(response, 409, "provider_in_use", says=["eval", "train"])
    assert "cpu" not in error["message"]
    assert Provider.objects.filter(name="gpu-cloud").exists()


def test_it_refuses_to_remove_a_provider_with_live_daemons(operator):
    gpu = builders.provider(name="gpu-cloud")
    builders.daemon(provider=gpu)

    response = operator.delete(f"{URL}gpu-cloud/")

    assert_error(response, 409, "provider_in_use", says="live daemon")
    assert Provider.objects.filter(name="gpu-cloud").exists()


def test_removing_a_provider_keeps_its_dead_daemons(operator):
    gpu = builders.provider(name="gpu-cloud")
    dead = builders.daemon(provider=gpu, state="terminated")

    assert operator.delete(f"{URL}gpu-cloud/").status_code == 204
    dead.refresh_from_db()
    assert dead.provider is None


@pytest.mark.parametrize(
    "config, path",
    [
        ({"headers": {"Authorization": "Bearer abc123"}}, "config.headers.Authorization"),
        ({"ssh": {"passphrase": "hunter2"}}, "config.ssh.passphrase"),
        ({"ssh_key": "-----BEGIN OPENSSH PRIVATE KEY-----"}, "config.ssh_key"),
    ],
)
def test_it_refuses_other_common_credential_keys(operator, config, path):
    response = add(operator, name="gpu-cloud", kind="local", config=config)

    assert_error(response, 400, "invalid", field=path)
