"""PATCH /api/v1/queues/NAME/ — `lakeshore queues patch`."""

from datetime import datetime

import pytest

from tests.support import builders
from tests.support.assertions import assert_error
from tests.support.shapes import QUEUE_KEYS

pytestmark = pytest.mark.django_db

URL = "/api/v1/queues/training-h100/"
POOL = {"kind": "pool_with_threshold", "min": 2, "max": 16, "threshold": 0.7}


@pytest.fixture
def training():
    """The cookbook's queue."""
    builders.provider(name="my-gpu-provider")
    return builders.queue(
        name="training-h100",
        kind="priority",
        provider="my-gpu-provider",
        elasticity_spec=dict(POOL),
        instance_type="p4d.24xlarge",
        max_depth=1000,
        on_full="reject",
    )


def patch(client, body, url=URL, **params):
    query = "".join(f"?{key}={value}" for key, value in params.items())
    return client.patch(url + query, body, format="json")


def current(client, url=URL) -> dict:
    return client.get(url).json()


def test_it_changes_the_description(operator, training):
    response = patch(operator, {"description": "h100 prod"})

    assert response.status_code == 200
    body = response.json()
    assert set(body) == QUEUE_KEYS
    assert body["description"] == "h100 prod"
    assert datetime.fromisoformat(body["updated_at"]) > training.updated_at
    assert current(operator)["description"] == "h100 prod"


def test_it_changes_max_and_threshold_keeping_min(operator, training):
    response = patch(operator, {"elasticity": {"max": 32, "threshold": 0.6}})

    assert response.status_code == 200
    expected = {"kind": "pool_with_threshold", "min": 2, "max": 32, "threshold": 0.6}
    assert response.json()["elasticity"] == expected
    assert current(operator)["elasticity"] == expected


def test_it_changes_the_backlog(operator, training):
    response = patch(operator, {"max_depth": 2000, "on_full": "block"})

    assert response.status_code == 200
    assert (response.json()["max_depth"], response.json()["on_full"]) == (2000, "block")
    assert current(operator)["on_full"] == "block"


def test_it_makes_the_backlog_unbounded(operator, training):
    response = patch(operator, {"max_depth": None})

    assert response.status_code == 200
    assert current(operator)["max_depth"] is None


def test_it_changes_the_daemon_template(operator, training):
    body = {"instance_type": "p5.48xlarge", "image_id": "ami-9", "runner": "py313"}

    response = patch(operator, body)

    assert response.status_code == 200
    assert {key: current(operator)[key] for key in body} == body


def test_an_empty_provider_clears_it(operator, training):
    response = patch(operator, {"provider": ""})

    assert response.status_code == 200
    assert response.json()["provider"] is None
    assert current(operator)["provider"] is None


def test_it_switches_to_another_provider(operator, training):
    builders.provider(name="other-cloud")

    response = patch(operator, {"provider": "other-cloud"})

    assert response.status_code == 200
    assert current(operator)["provider"] == "other-cloud"


def test_it_refuses_an_unknown_provider(operator, training):
    response = patch(operator, {"provider": "nope"})

    assert_error(response, 400, "invalid", field="provider", says="nope")
    assert current(operator)["provider"] == "my-gpu-provider"


def test_it_changes_the_temperature_of_a_boltzmann_queue(operator):
    builders.queue(name="hot", kind="boltzmann")

    response = patch(operator, {"temperature": 3.5}, url="/api/v1/queues/hot/")

    assert response.status_code == 200
    assert response.json()["temperature"] == 3.5


def test_it_refuses_a_temperature_on_a_queue_that_is_not_boltzmann(operator, training):
    response = patch(operator, {"temperature": 3.5})

    assert_error(response, 400, "invalid", field="temperature", says="boltzmann")


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("kind", "fifo", "immutable"),
        ("name", "renamed", "cannot change"),
        ("state", "paused", "drain, pause, resume"),
    ],
)
def test_it_refuses_to_change_what_is_immutable(operator, training, field, value, says):
    response = patch(operator, {field: value})

    assert_error(response, 400, "invalid", field=field, says=says)
    assert current(operator)["kind"] == "priority"
    assert current(operator)["state"] == "active"


def test_it_refuses_to_change_the_elasticity_kind(operator, training):
    response = patch(operator, {"elasticity": {"kind": "fixed", "min": 3}})

    assert_error(response, 400, "invalid", field="elasticity.kind", says="immutable")
    assert current(operator)["elasticity"] == POOL


def test_it_refuses_elasticity_numbers_on_a_queue_without_elasticity(operator):
    builders.queue(name="plain")

    response = patch(operator, {"elasticity": {"max": 4}}, url="/api/v1/queues/plain/")

    assert_error(response, 400, "invalid", field="elasticity.max", says="no elasticity")
    assert current(operator, "/api/v1/queues/plain/")["elasticity"] is None


def test_it_refuses_min_above_max_after_merging_and_saves_nothing(operator, training):
    response = patch(operator, {"description": "changed", "elasticity": {"min": 20}})

    assert_error(response, 400, "invalid", field="elasticity.min", says="must not exceed max")
    after = current(operator)
    assert after["elasticity"] == POOL
    assert after["description"] == ""


def test_it_refuses_max_below_the_current_min(operator, training):
    response = patch(operator, {"elasticity": {"max": 1}})

    assert_error(response, 400, "invalid", field="elasticity.min", says="(2)")
    assert current(operator)["elasticity"] == POOL


@pytest.mark.parametrize("threshold", [0, 1.01])
def test_it_refuses_a_threshold_out_of_range(operator, training, threshold):
    response = patch(operator, {"elasticity": {"threshold": threshold}})

    assert_error(response, 400, "invalid", field="elasticity.threshold", says="(0, 1]")
    assert current(operator)["elasticity"] == POOL


@pytest.mark.parametrize(
    "spec, body, field",
    [
        ({"kind": "fixed", "min": 2}, {"max": 4}, "elasticity.max"),
        ({"kind": "max_count", "max": 4}, {"min": 1}, "elasticity.min"),
        ({"kind": "fully_elastic"}, {"threshold": 0.5}, "elasticity.threshold"),
    ],
)
def test_it_refuses_a_parameter_the_kind_does_not_use(operator, spec, body, field):
    builders.queue(name="elastic", elasticity_spec=spec)

    response = patch(operator, {"elasticity": body}, url="/api/v1/queues/elastic/")

    assert_error(response, 400, "invalid", field=field, says="does not use")


def test_it_refuses_a_misspelt_field(operator, training):
    response = patch(operator, {"descripton": "typo"})

    assert_error(response, 400, "invalid", field="descripton", says="unknown field")


@pytest.mark.parametrize(
    "body, field", [({"max_depth": 0}, "max_depth"), ({"on_full": "x"}, "on_full")]
)
def test_it_refuses_a_bad_backlog(operator, training, body, field):
    response = patch(operator, body)

    assert_error(response, 400, "invalid", field=field)
    assert current(operator)["max_depth"] == 1000


def test_a_dry_run_shows_the_result_and_saves_nothing(operator, training):
    response = patch(
        operator, {"elasticity": {"min": 4, "max": 32}, "description": "new"}, dry_run="true"
    )

    assert response.status_code == 200
    body = response.json()
    assert set(body) == QUEUE_KEYS | {"dry_run", "desired"}
    assert body["dry_run"] is True
    assert body["elasticity"]["min"] == 4
    assert body["elasticity"]["max"] == 32
    assert body["description"] == "new"
    assert body["desired"] == 4  # nothing to do: the new min
    after = current(operator)
    assert after["elasticity"] == POOL
    assert after["description"] == ""


def test_a_dry_run_still_refuses_bad_numbers(operator, training):
    response = patch(operator, {"elasticity": {"min": 40}}, dry_run="true")

    assert_error(response, 400, "invalid", field="elasticity.min")


def test_a_real_patch_has_no_dry_run_keys(operator, training):
    body = patch(operator, {"description": "x"}, dry_run="false").json()

    assert "dry_run" not in body
    assert "desired" not in body
    assert body["description"] == "x"


def test_it_answers_404_for_an_unknown_queue(operator):
    response = patch(operator, {"description": "x"}, url="/api/v1/queues/nope/")

    assert_error(response, 404, "not_found", says="nope")


def test_it_refuses_a_max_depth_too_large_to_store(operator, training):
    response = patch(operator, {"max_depth": 2**31})

    assert_error(response, 400, "invalid", field="max_depth")
