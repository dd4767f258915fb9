"""A provider's config is checked against its kind's schema (fleet/provider_configs.py):
types, ranges, required keys; unknown keys are refused, naming the allowed ones."""

import pytest

from fleet.models import Provider
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

URL = "/api/v1/providers/"


def add(client, kind, config):
    return client.post(URL, {"name": "gpu", "kind": kind, "config": config}, format="json")


@pytest.mark.parametrize(
    "kind, config",
    [
        ("simulated", {}),
        ("simulated", {"startup_seconds": 0}),
        ("simulated", {"startup_seconds": 2.5, "credential_ref": "vault:sim"}),
        ("simulated", {"fail": "quota exceeded"}),
        ("local", {"concurrency": 1}),
        ("local", {"concurrency": 64, "credential_ref": "vault:here"}),
    ],
)
def test_it_accepts_the_keys_of_each_kind(operator, kind, config):
    response = add(operator, kind, config)

    assert response.status_code == 201, response.json()
    assert response.json()["config"] == config
    assert Provider.objects.get(name="gpu").config == config


@pytest.mark.parametrize(
    "kind, config, field, message",
    [
        ("simulated", {"startup_seconds": "abc"}, "startup_seconds", "must be a number ≥ 0"),
        ("simulated", {"startup_seconds": -1}, "startup_seconds", "must be a number ≥ 0"),
        ("simulated", {"startup_seconds": True}, "startup_seconds", "must be a number ≥ 0"),
        ("simulated", {"startup_seconds": 10**9}, "startup_seconds", "at most 86400"),
        ("simulated", {"fail": 3}, "fail", "must be a string"),
        ("local", {"concurrency": 0}, "concurrency", "from 1 to 64"),
        ("local", {"concurrency": 65}, "concurrency", "from 1 to 64"),
        ("local", {"concurrency": 2.5}, "concurrency", "from 1 to 64"),
        ("local", {"concurrency": "2"}, "concurrency", "from 1 to 64"),
        ("local", {"credential_ref": ""}, "credential_ref", "non-empty string"),
        ("local", {"credential_ref": ["vault"]}, "credential_ref", "non-empty string"),
    ],
)
def test_it_refuses_a_wrong_type_or_range_and_names_the_key(operator, kind, config, field, message):
    response = add(operator, kind, config)

    error = assert_error(response, 400, "invalid", field=f"config.{field}", says=message)
    assert error["fields"] == {f"config.{field}": error["fields"][f"config.{field}"]}
    assert message in error["fields"][f"config.{field}"]
    assert not Provider.objects.exists()


def test_it_answers_the_issue_example_with_the_field_error(operator):
    response = add(operator, "simulated", {"startup_seconds": "abc"})

    error = assert_error(response, 400, "invalid")
    assert error["fields"] == {"config.startup_seconds": "must be a number ≥ 0"}


@pytest.mark.parametrize(
    "kind, key, allowed",
    [
        ("local", "allowed_modules", "concurrency, credential_ref"),
        ("local", "startup_seconds", "concurrency, credential_ref"),  # another kind's key
        ("simulated", "region", "credential_ref, fail, startup_seconds"),
        ("simulated", "concurrency", "credential_ref, fail, startup_seconds"),
    ],
)
def test_it_refuses_an_unknown_key_naming_it_and_the_allowed_ones(operator, kind, key, allowed):
    response = add(operator, kind, {key: "os,subprocess"})

    error = assert_error(response, 400, "invalid", field=f"config.{key}", says=[key, allowed])
    assert "unknown key" in error["fields"][f"config.{key}"]
    assert allowed in error["fields"][f"config.{key}"]
    assert not Provider.objects.exists()


def test_it_names_every_bad_key_at_once(operator):
    response = add(operator, "local", {"concurrency": 0, "allowed_modules": "os", "x": 1})

    error = assert_error(response, 400, "invalid")
    assert set(error["fields"]) == {"config.concurrency", "config.allowed_modules", "config.x"}


def test_the_credentials_check_runs_first_and_keeps_its_message(operator):
    response = add(operator, "local", {"api_key": "x", "allowed_modules": "os"})

    error = assert_error(response, 400, "invalid", field="config.api_key", says="credential_ref")
    assert error["fields"] == {"config.api_key": "credentials are refused"}


def test_it_checks_a_patched_config_against_the_providers_kind(operator):
    builders.provider(name="gpu", kind="local", config={"concurrency": 2})

    refused = operator.patch(f"{URL}gpu/", {"config": {"startup_seconds": 1}}, format="json")
    bad = operator.patch(f"{URL}gpu/", {"config": {"concurrency": "lots"}}, format="json")
    good = operator.patch(f"{URL}gpu/", {"config": {"concurrency": 4}}, format="json")

    assert_error(refused, 400, "invalid", field="config.startup_seconds", says="unknown key")
    assert_error(bad, 400, "invalid", field="config.concurrency", says="from 1 to 64")
    assert good.status_code == 200
    assert Provider.objects.get().config == {"concurrency": 4}


def test_a_description_patch_leaves_the_config_alone(operator):
    builders.provider(name="gpu", kind="simulated", config={"startup_seconds": 3})

    response = operator.patch(f"{URL}gpu/", {"description": "sims"}, format="json")

    assert response.status_code == 200
    assert response.json()["config"] == {"startup_seconds": 3}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_cli_prints_the_servers_field_error(sh):  # noqa: F811
    result = sh(
        """lakeshore providers add x --kind simulated --config '{"startup_seconds": "abc"}'""",
        exit=1,
    )

    assert "config.startup_seconds: must be a number ≥ 0" in result.stderr
    unknown = sh(
        """lakeshore providers add x --kind local --config '{"allowed_modules": "os"}'""",
        exit=1,
    )
    assert "config.allowed_modules: unknown key" in unknown.stderr
    assert "concurrency, credential_ref" in unknown.stderr
    assert not Provider.objects.exists()
