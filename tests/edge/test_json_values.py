"""Issue 29, "Small JSON bodies cost hundreds of megabytes", through the real WSGI
application in this process, on both doors (the lean path, and Django with DRF):

- count before you decode: a body holding more than LAKESHORE_JSON_MAX_VALUES values
  (array items and object members, nested ones included) is refused with 400 naming
  the setting, counted on its text (lakeshore_admin/parsers.json_values);
- a list's length before its items: a list longer than its field's bound gets one
  error, not one per item (DRF's own ListField validates every item first: the
  control), and every list an input takes has a bound;
- an error answer shows its first 20 errors and counts the rest;
- a daemon's credential on another daemon's id is refused before its body is read.

tests/edge/test_json_body_cost_server.py measures the issue's bodies on `make
run`'s server."""

import json

import pytest
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.handlers.wsgi import WSGIHandler
from hypothesis import given
from hypothesis import strategies as st
from rest_framework import serializers

from accounts.authentication import token_cache
from edge.lean_path import LeanPath
from fleet.api import serializers as fleet_inputs
from lakeshore import joblog
from lakeshore_admin.api_errors import ERRORS_SHOWN
from lakeshore_admin.parsers import DepthLimitedJSONFormField, json_values
from lakeshore_admin.strict_input import StrictInput, name_field
from tests.edge.test_token_before_body import call
from tests.support import builders

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.security]

SUBMIT = "/api/v1/jobs/"
ECHO = "lakeshore.functions.echo"


def _json(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


@pytest.fixture(params=["lean", "full"])
def door(request, settings):
    """The WSGI application, its lean path on or off."""
    token_cache.clear()
    settings.LAKESHORE_LEAN_PATH = request.param == "lean"
    yield LeanPath(WSGIHandler())
    token_cache.clear()


# ---------------------------------------------------------------------------- the count


def _decoded_values(value) -> int:
    if isinstance(value, list):
        return len(value) + sum(_decoded_values(item) for item in value)
    if isinstance(value, dict):
        return len(value) + sum(_decoded_values(item) for item in value.values())
    return 0


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{},:"\\ ab\n'),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=30,
)


@given(_JSON, st.sampled_from([None, 1]))
def test_the_count_on_the_text_is_the_decoded_values_count(value, indent):
    assert json_values(json.dumps(value, indent=indent)) == _decoded_values(value)


@pytest.mark.parametrize("over", [False, True])
def test_past_the_bound_a_body_is_refused_naming_the_setting(door, settings, over):
    settings.LAKESHORE_JSON_MAX_VALUES = 1000
    body = {"function": ECHO, "queue": "w", "args": [0] * (997 + over)}  # 3 members + args
    builders.queue(name="w")
    status, _, answer, _ = call(door, SUBMIT, _json(body), token=builders.token())
    if over:
        assert status == 400 and answer["error"]["code"] == "invalid"
        assert "LAKESHORE_JSON_MAX_VALUES" in answer["error"]["message"]
    else:  # the control: at the bound, submitted
        assert status == 201, answer


def test_the_admin_forms_json_fields_are_bounded_too(settings):
    settings.LAKESHORE_JSON_MAX_VALUES = 1000
    field = DepthLimitedJSONFormField()
    assert field.clean(json.dumps([0] * 1000)) == [0] * 1000
    with pytest.raises(DjangoValidationError, match="LAKESHORE_JSON_MAX_VALUES"):
        field.clean(json.dumps([0] * 1001))


def test_a_daemons_log_shipment_stays_under_the_default_bound(settings):
    book = joblog.LogBook()
    book.add((1, 1), "d1", "o", [""] * 150_000)
    first = book.take()
    assert sum(len(chunk["lines"]) for chunk in first) == joblog.SHIPMENT_MAX_LINES
    assert json_values(json.dumps({"chunks": first})) < settings.LAKESHORE_JSON_MAX_VALUES
    assert sum(len(chunk["lines"]) for chunk in book.take()) == 50_000  # the rest, next


# ---------------------------------------------------------------------------- lengths first


def test_a_registration_past_64_queues_gets_one_error_not_one_per_name(door):
    status, _, answer, _ = call(
        door,
        "/api/v1/daemons/register/",
        _json({"name": "d", "queues": ["AB"] * 20_000}),  # every name a bad one, too
        token=builders.token("daemon"),
    )
    assert status == 400
    assert answer["error"]["fields"] == {
        "queues": "Ensure this field has no more than 64 elements."
    }


def test_control_drfs_own_list_field_validates_every_item_before_the_length():
    class Plain(serializers.Serializer):
        queues = serializers.ListField(child=name_field(), max_length=64)

    plain = Plain(data={"queues": ["AB"] * 5_000})
    assert not plain.is_valid()
    assert len(plain.errors["queues"]) == 5_000  # one error an item: the cost


def test_a_heartbeat_past_its_held_bound_gets_one_error_on_either_door(door):
    builders.queue(name="w")
    daemon = builders.daemon(queues=["w"])
    status, _, answer, _ = call(
        door,
        f"/api/v1/daemons/{daemon.pk}/heartbeat/",
        _json({"held": ["x"] * 10_001}),
        token=builders.token("operator"),
    )
    assert status == 400
    assert answer["error"]["fields"] == {
        "held": "Ensure this field has no more than 10000 elements."
    }


def _inputs():
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    return sorted(set(subclasses(StrictInput)), key=lambda cls: cls.__qualname__)


def test_every_list_an_input_takes_has_a_bound():
    """A list whose items can be refused is bounded (and StrictInput checks the bound
    first); a list of JSON values (a job's args) is bounded by the values count."""
    unbounded = []
    for cls in _inputs():
        for name, field in cls().fields.items():
            listed = isinstance(field, (serializers.ListField, serializers.ListSerializer))
            if not listed or isinstance(field.child, serializers.JSONField):
                continue
            if field.max_length is None:
                unbounded.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    assert unbounded == []
    assert fleet_inputs.DaemonRegister().fields["queues"].max_length == 64


# ---------------------------------------------------------------------------- error answers


@pytest.mark.parametrize("bad", [ERRORS_SHOWN, 300])
def test_an_error_answer_shows_the_first_20_errors_and_counts_the_rest(door, bad):
    builders.queue(name="w")
    batch = [{"function": ECHO, "queue": "w", "priority": "high"} for _ in range(bad)]
    status, _, answer, _ = call(door, SUBMIT, _json(batch), token=builders.token())
    assert status == 400
    error = answer["error"]
    assert len(error["fields"]) == ERRORS_SHOWN
    assert list(error["fields"])[:2] == ["0.priority", "1.priority"]
    if bad > ERRORS_SHOWN:
        assert error["more_errors"] == bad - ERRORS_SHOWN
        assert error["message"].endswith(f"; and {bad - ERRORS_SHOWN} more errors")
    else:  # the control: all of them, and nothing said of more
        assert "more_errors" not in error


def test_an_error_that_quotes_its_input_is_cut_short(door):
    builders.queue(name="w")
    huge = "x" * 200_000
    status, _, answer, _ = call(
        door, SUBMIT, _json({"function": ECHO, "queue": "w", "priority": huge}),
        token=builders.token(),
    )  # fmt: skip
    assert status == 400
    assert len(json.dumps(answer)) < 3000


# ---------------------------------------------------------------------------- the daemon's own


def test_a_credential_on_another_daemons_id_is_refused_with_its_body_unread(door):
    builders.queue(name="w")
    bootstrap = builders.token("daemon")
    made = [
        call(
            door, "/api/v1/daemons/register/", _json({"name": n, "queues": ["w"]}), token=bootstrap
        )[2]  # fmt: skip
        for n in ("a", "b")
    ]
    mine, other = made
    raw = _json({"limit": 1, "pad": "x" * 100_000})
    for route in ("claim", "exchange", "complete", "heartbeat"):
        status, _, answer, read = call(
            door, f"/api/v1/daemons/{other['id']}/{route}/", raw, token=mine["token"]
        )
        assert (status, answer["error"]["code"], read) == (403, "not_your_daemon", 0), route
    # the control: on its own id the body is read (and its unknown field refused)
    status, _, answer, read = call(
        door, f"/api/v1/daemons/{mine['id']}/claim/", raw, token=mine["token"]
    )
    assert status == 400 and read == len(raw) and "pad" in answer["error"]["fields"]
