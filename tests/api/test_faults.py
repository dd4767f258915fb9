"""Inputs and failures a user can cause on purpose: always the JSON error body, never an
HTML page or a 500."""

import json

import pytest
from django.db import OperationalError

from queues.models import QueueQuerySet
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db


def test_it_refuses_a_nul_character_in_json_arguments(operator):
    body = b'{"function": "a.b", "args": ["bad\\u0000byte"]}'
    response = operator.post("/api/v1/jobs/", body, content_type="application/json")
    assert_error(response, 400, "invalid", field="args", says=["NUL"])


def test_it_refuses_a_nul_character_in_provider_config(operator):
    body = b'{"name": "p", "kind": "simulated", "config": {"region": "eu\\u0000"}}'
    response = operator.post("/api/v1/providers/", body, content_type="application/json")
    assert_error(response, 400, "invalid", field="config", says=["NUL"])


def test_a_body_over_10_mb_gets_a_json_error(operator):
    payload = json.dumps({"function": "a.b", "args": ["x" * (11 * 1024 * 1024)]})
    response = operator.post("/api/v1/jobs/", payload, content_type="application/json")
    assert response.status_code in (400, 413)
    assert response["Content-Type"].startswith("application/json")
    assert "10 MB" in response.json()["error"]["message"]


def test_a_batch_over_10000_is_refused(operator):
    batch = [{"function": "a.b"}] * 10_001
    response = operator.post("/api/v1/jobs/", batch, format="json")
    assert_error(response, 400, "invalid", says=["10,000"])


def test_a_database_outage_answers_503_json(operator, monkeypatch):
    def down(self, *args, **kwargs):
        raise OperationalError("connection to server on socket failed")

    monkeypatch.setattr(QueueQuerySet, "for_list", down)
    response = operator.get("/api/v1/queues/")
    assert_error(response, 503, "unavailable", says=["database"])
