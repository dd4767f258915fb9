"""The lean input path (lakeshore_admin/lean_input.py) answers exactly what DRF's
serializers answer: the same validated data, or the same errors, for any input."""

import base64
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.exceptions import ValidationError

from fleet.api import serializers as fs
from jobs.api import serializers as s
from lakeshore_admin.lean_input import validated

CLASSES = [s.SubmitInput, fs.ClaimInput, fs.CompleteInput, fs.HeartbeatInput, fs.ExchangeInput]

tricky = st.sampled_from(
    [
        "",
        " ",
        " x",
        "x ",
        "\tx",
        "a\x00b",
        "\ud800",
        "bench",
        "Bad Name",
        "succeeded",
        "failed",
        "timeout",
        "json",
        "envelope",
        "json ",
        "5",
        "5.0",
        "true",
        "x" * 301,
        "lakeshore.functions.echo",
        base64.b64encode(b"blob").decode(),
        "not base64!",
    ]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, 20, 21, 100, 101, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -1, 0.5]),
    st.floats(allow_nan=True, allow_infinity=True),
    tricky,
    tricky,
    st.text(alphabet=st.sampled_from(" \ta-1\x00\u00e9"), max_size=5),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


BASES = {
    s.SubmitInput: {"function": "lakeshore.functions.echo", "queue": "bench", "args": [1]},
    fs.ClaimInput: {"limit": 1},
    fs.CompleteInput: {"invocation": 7, "attempt": 1, "state": "succeeded"},
    fs.HeartbeatInput: {"held": [1, 2]},
    fs.ExchangeInput: {"outcomes": [], "limit": 1},
}


def objects_for(cls):
    """A well-formed body with a few fields changed to anything, or removed, and keys
    it does not know now and then: mostly one mistake away from valid."""
    names = list(cls().fields) + ["unknown"]
    changes = st.dictionaries(st.sampled_from(names), values, max_size=3)
    if cls is fs.ExchangeInput:
        changes = st.one_of(
            changes,
            st.fixed_dictionaries(
                {"outcomes": st.lists(objects_for(fs.CompleteInput), max_size=3)}
            ),
        )
    removed = st.sets(st.sampled_from(names), max_size=2)
    return st.builds(
        lambda change, drop: {k: v for k, v in {**BASES[cls], **change}.items() if k not in drop},
        changes,
        removed,
    )


def _plain(x):
    return json.loads(json.dumps(x, default=repr))


def drf(cls, data, many=False):
    serializer = cls(data=data, many=many)
    if serializer.is_valid():
        return "ok", _plain(serializer.validated_data)
    return "error", _plain(serializer.errors)


def lean(cls, data, many=False):
    try:
        return "ok", _plain(validated(cls, data, many=many))
    except ValidationError as exc:
        return "error", _plain(exc.detail)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_it_answers_what_drf_answers(cls, data):
    body = data.draw(st.one_of(objects_for(cls), values))
    assert lean(cls, body) == drf(cls, body)


@settings(max_examples=150, deadline=None)
@given(items=st.lists(objects_for(s.SubmitInput), max_size=4))
def test_a_batch_answers_what_drf_answers(items):
    assert lean(s.SubmitInput, items, many=True) == drf(s.SubmitInput, items, many=True)


EXAMPLES = [
    (s.SubmitInput, {"function": "f", "queue": "bench", "args": [1], "priority": 5.5}),
    (fs.ClaimInput, {"limit": 10, "wait": 20, "wires": ["json", "envelope"]}),
    (
        fs.CompleteInput,
        {"invocation": 7, "attempt": 1, "state": "succeeded", "result": {"a": [1]}, "retry": False},
    ),
    (
        fs.ExchangeInput,
        {
            "outcomes": [{"invocation": 7, "attempt": 1, "state": "failed", "error": "x"}],
            "limit": 1,
        },
    ),
]


@pytest.mark.parametrize("cls,body", EXAMPLES, ids=lambda v: getattr(v, "__name__", ""))
def test_well_formed_input_never_builds_a_drf_serializer(cls, body, monkeypatch):
    expected = drf(cls, body)
    assert expected[0] == "ok"

    def refuse(*args, **kwargs):
        raise AssertionError("DRF's path ran")

    monkeypatch.setattr(cls, "is_valid", refuse)
    assert lean(cls, body) == expected


def test_bad_input_gets_drfs_own_error():
    body = {"function": " ", "queue": "Bad Name", "max_attempts": 0}
    with pytest.raises(ValidationError) as refused:
        validated(s.SubmitInput, body)
    assert set(refused.value.detail) == {"function", "queue", "max_attempts"}  # each, as DRF
    assert _plain(refused.value.detail) == drf(s.SubmitInput, body)[1]
