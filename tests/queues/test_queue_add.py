"""POST /api/v1/queues/ — `lakeshore queues add`."""

import pytest

from queues.models import Queue
from tests.support import builders
from tests.support.assertions import assert_error
from tests.support.shapes import QUEUE_KEYS

pytestmark = pytest.mark.django_db

URL = "/api/v1/queues/"


def add(client, **body):
    return client.post(URL, body, format="json")


def test_it_adds_a_queue_from_a_name_alone(operator):
    response = add(operator, name="training-h100")

    assert response.status_code == 201
    body = response.json()
    assert set(body) == QUEUE_KEYS
    assert body["name"] == "training-h100"
    assert body["kind"] == "fifo"
    assert body["description"] == ""
    assert body["state"] == "active"
    assert body["provider"] is None
    assert body["members"] == 0
    assert body["elasticity"] is None
    assert body["instance_type"] == ""
    assert body["image_id"] == ""
    assert body["runner"] == ""
    assert body["max_depth"] is None
    assert body["on_full"] == "reject"
    assert body["temperature"] == 1.0
    assert body["created_at"].endswith("Z")
    assert body["updated_at"].endswith("Z")
    assert Queue.objects.filter(name="training-h100").exists()


def test_it_adds_the_cookbook_example(operator):
    builders.provider(name="my-gpu-provider")

    response = add(
        operator,
        name="training-h100",
        kind="priority",
        provider="my-gpu-provider",
        elasticity={"kind": "pool_with_threshold", "min": 2, "max": 16, "threshold": 0.7},
        instance_type="p4d.24xlarge",
        max_depth=1000,
        on_full="reject",
    )

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["kind"] == "priority"
    assert body["provider"] == "my-gpu-provider"
    assert body["elasticity"] == {
        "kind": "pool_with_threshold",
        "min": 2,
        "max": 16,
        "threshold": 0.7,
    }
    assert body["instance_type"] == "p4d.24xlarge"
    assert body["max_depth"] == 1000
    assert body["on_full"] == "reject"


def test_it_adds_with_a_description(operator):
    response = add(operator, name="eval", kind="priority", description="evaluation, urgent first")

    assert response.status_code == 201
    assert response.json()["description"] == "evaluation, urgent first"


def test_it_adds_a_daemon_template_and_a_blocking_backlog(operator):
    response = add(
        operator,
        name="tpl",
        instance_type="m5.large",
        image_id="ami-123",
        runner="python3.12",
        max_depth=5,
        on_full="block",
    )

    assert response.status_code == 201
    body = response.json()
    assert (body["instance_type"], body["image_id"], body["runner"]) == (
        "m5.large",
        "ami-123",
        "python3.12",
    )
    assert (body["max_depth"], body["on_full"]) == (5, "block")


@pytest.mark.parametrize("kind", ["fifo", "priority", "boltzmann", "filo"])
def test_it_adds_each_kind(operator, kind):
    response = add(operator, name=f"q-{kind}", kind=kind)

    assert response.status_code == 201
    assert response.json()["kind"] == kind


def test_it_takes_a_temperature_for_a_boltzmann_queue(operator):
    response = add(operator, name="hot", kind="boltzmann", temperature=0.25)

    assert response.status_code == 201
    assert response.json()["temperature"] == 0.25


@pytest.mark.parametrize(
    "spec, stored",
    [
        ({"kind": "fixed", "min": 3}, {"kind": "fixed", "min": 3, "max": None, "threshold": None}),
        (
            {"kind": "fully_elastic"},
            {"kind": "fully_elastic", "min": 0, "max": None, "threshold": None},
        ),
        (
            {"kind": "fully_elastic", "min": 1, "max": 8},
            {"kind": "fully_elastic", "min": 1, "max": 8, "threshold": None},
        ),
        (
            {"kind": "pool_with_threshold", "threshold": 0.5},
            {"kind": "pool_with_threshold", "min": 0, "max": None, "threshold": 0.5},
        ),
        (
            {"kind": "pool_with_threshold", "threshold": 1.0},
            {"kind": "pool_with_threshold", "min": 0, "max": None, "threshold": 1.0},
        ),
        (
            {"kind": "max_count", "max": 4},
            {"kind": "max_count", "min": None, "max": 4, "threshold": None},
        ),
    ],
)
def test_it_adds_each_elasticity_kind(operator, spec, stored):
    response = add(operator, name="elastic", elasticity=spec)

    assert response.status_code == 201, response.json()
    assert response.json()["elasticity"] == stored


def test_it_accepts_a_63_character_name(operator):
    name = "a" * 63

    response = add(operator, name=name)

    assert response.status_code == 201
    assert response.json()["name"] == name


@pytest.mark.parametrize(
    "name",
    ["Training", "training_h100", "-training", "a" * 64, "", "with space", "dot.ted"],
)
def test_it_refuses_a_bad_name(operator, name):
    response = add(operator, name=name)

    assert_error(response, 400, "invalid", field="name")
    assert not Queue.objects.exists()


def test_the_bad_name_message_shows_the_pattern(operator):
    response = add(operator, name="Training")

    assert_error(response, 400, "invalid", field="name", says="^[a-z0-9][a-z0-9-]*$")


def test_it_refuses_a_missing_name(operator):
    response = add(operator, kind="fifo")

    assert_error(response, 400, "invalid", field="name", says="required")


def test_it_refuses_a_duplicate_name(operator):
    builders.queue(name="eval", description="the first")

    response = add(operator, name="eval")

    assert_error(response, 409, "already_exists", field="name", says="already exists")
    assert Queue.objects.get(name="eval").description == "the first"


def test_it_refuses_an_unknown_kind(operator):
    response = add(operator, name="q", kind="lifo")

    assert_error(response, 400, "invalid", field="kind", says="lifo")


@pytest.mark.parametrize(
    "hyphenated, underscored",
    [
        ("pool-with-threshold", "pool_with_threshold"),
        ("fully-elastic", "fully_elastic"),
        ("max-count", "max_count"),
    ],
)
def test_it_refuses_the_cli_spelling_and_names_the_api_one(operator, hyphenated, underscored):
    response = add(operator, name="q", elasticity={"kind": hyphenated, "threshold": 0.7})

    assert_error(response, 400, "invalid", field="elasticity.kind", says=underscored)


def test_it_refuses_an_unknown_elasticity_kind(operator):
    response = add(operator, name="q", elasticity={"kind": "sometimes"})

    assert_error(response, 400, "invalid", field="elasticity.kind")


def test_it_refuses_elasticity_without_a_kind(operator):
    response = add(operator, name="q", elasticity={"min": 1})

    assert_error(response, 400, "invalid", field="elasticity.kind")


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"kind": "fully_elastic", "threshold": 0.5}, "elasticity.threshold"),
        ({"kind": "max_count", "min": 1, "max": 4}, "elasticity.min"),
        ({"kind": "max_count", "min": 0, "max": 4}, "elasticity.min"),
        ({"kind": "fixed", "min": 2, "max": 4}, "elasticity.max"),
        ({"kind": "fixed", "min": 2, "threshold": 0.5}, "elasticity.threshold"),
    ],
)
def test_it_refuses_a_parameter_the_kind_does_not_use(operator, spec, field):
    response = add(operator, name="q", elasticity=spec)

    error = assert_error(response, 400, "invalid", field=field, says="does not use")
    assert field.split(".")[1] in error["message"]
    assert not Queue.objects.exists()


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"kind": "fixed"}, "elasticity.min"),
        ({"kind": "pool_with_threshold", "min": 1, "max": 4}, "elasticity.threshold"),
        ({"kind": "max_count"}, "elasticity.max"),
    ],
)
def test_it_refuses_a_missing_required_parameter(operator, spec, field):
    response = add(operator, name="q", elasticity=spec)

    assert_error(response, 400, "invalid", field=field, says="needs")


@pytest.mark.parametrize("threshold", [0, 0.0, 1.01, -0.5, 2])
def test_it_refuses_a_threshold_outside_zero_to_one(operator, threshold):
    spec = {"kind": "pool_with_threshold", "threshold": threshold}

    response = add(operator, name="q", elasticity=spec)

    assert_error(response, 400, "invalid", field="elasticity.threshold", says="(0, 1]")


def test_it_refuses_min_above_max(operator):
    spec = {"kind": "fully_elastic", "min": 5, "max": 3}

    response = add(operator, name="q", elasticity=spec)

    assert_error(response, 400, "invalid", field="elasticity.min", says="must not exceed max")


def test_it_refuses_max_zero(operator):
    response = add(operator, name="q", elasticity={"kind": "max_count", "max": 0})

    assert_error(response, 400, "invalid", field="elasticity.max")


def test_it_refuses_a_negative_min(operator):
    response = add(operator, name="q", elasticity={"kind": "fixed", "min": -1})

    assert_error(response, 400, "invalid", field="elasticity.min")


def test_it_refuses_an_unknown_elasticity_parameter(operator):
    spec = {"kind": "pool_with_threshold", "treshold": 0.5}

    response = add(operator, name="q", elasticity=spec)

    assert_error(response, 400, "invalid", field="elasticity.treshold", says="unknown field")


def test_it_refuses_elasticity_that_is_not_an_object(operator):
    response = add(operator, name="q", elasticity="fixed")

    assert_error(response, 400, "invalid", field="elasticity")


@pytest.mark.parametrize("max_depth", [0, -1, "deep"])
def test_it_refuses_a_bad_max_depth(operator, max_depth):
    response = add(operator, name="q", max_depth=max_depth)

    assert_error(response, 400, "invalid", field="max_depth")


def test_it_refuses_an_unknown_on_full(operator):
    response = add(operator, name="q", on_full="bogus")

    assert_error(response, 400, "invalid", field="on_full", says="bogus")


def test_it_refuses_an_unknown_provider_and_names_it(operator):
    response = add(operator, name="q", provider="nope-provider")

    assert_error(response, 400, "invalid", field="provider", says="nope-provider")
    assert not Queue.objects.exists()


def test_it_refuses_a_temperature_on_a_queue_that_is_not_boltzmann(operator):
    response = add(operator, name="q", kind="priority", temperature=2.0)

    assert_error(response, 400, "invalid", field="temperature", says="boltzmann")


@pytest.mark.parametrize("temperature", [0, -1.5])
def test_it_refuses_a_temperature_not_above_zero(operator, temperature):
    response = add(operator, name="q", kind="boltzmann", temperature=temperature)

    assert_error(response, 400, "invalid", field="temperature", says="greater than 0")


def test_it_refuses_a_misspelt_field(operator):
    response = add(operator, name="q", descripton="typo")

    assert_error(response, 400, "invalid", field="descripton", says="unknown field")
    assert not Queue.objects.exists()


def test_it_refuses_malformed_json(operator):
    response = operator.post(URL, '{"name": "q",', content_type="application/json")

    assert_error(response, 400, "invalid", says="JSON")


def test_it_refuses_a_body_that_is_not_an_object(operator):
    response = operator.post(URL, ["q"], format="json")

    assert_error(response, 400, "invalid")


def test_it_refuses_a_form_encoded_body(operator):
    response = operator.post(URL, "name=q", content_type="application/x-www-form-urlencoded")

    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"max_depth": 2**31}, "max_depth"),
        ({"elasticity": {"kind": "fixed", "min": 2**31}}, "elasticity.min"),
        ({"elasticity": {"kind": "max_count", "max": 2**40}}, "elasticity.max"),
    ],
)
def test_it_refuses_numbers_too_large_to_store(operator, body, field):
    response = add(operator, name="q", **body)

    assert_error(response, 400, "invalid", field=field)
