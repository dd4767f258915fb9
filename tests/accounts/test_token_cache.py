"""A token that authenticated is trusted for LAKESHORE_TOKEN_CACHE_SECONDS per process:
repeated calls cost no token or role query, and a revocation takes effect at most that
many seconds late."""

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from accounts.authentication import token_cache
from accounts.models import ApiToken
from tests.support import builders

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _empty_cache():
    token_cache.clear()
    yield
    token_cache.clear()


def _client(raw):
    client = APIClient(SERVER_NAME="localhost")
    client.credentials(**builders.auth(raw))
    return client


def _token_queries(client) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get("/api/v1/queues/").status_code == 200
    return sum(
        1
        for q in ctx.captured_queries
        if "accounts_apitoken" in q["sql"] or "auth_user_groups" in q["sql"]
    )


def test_a_second_call_costs_no_token_or_role_query(settings):
    settings.LAKESHORE_TOKEN_CACHE_SECONDS = 5
    client = _client(builders.token("viewer"))
    assert _token_queries(client) >= 2  # the first looks the token and its roles up
    assert _token_queries(client) == 0


def test_without_the_cache_every_call_looks_the_token_up(settings):
    settings.LAKESHORE_TOKEN_CACHE_SECONDS = 0
    client = _client(builders.token("viewer"))
    _token_queries(client)
    assert _token_queries(client) >= 1


def test_a_revoked_token_is_refused_once_its_cache_entry_expires(settings):
    settings.LAKESHORE_TOKEN_CACHE_SECONDS = 0.5
    raw = builders.token("viewer")
    client = _client(raw)
    assert client.get("/api/v1/queues/").status_code == 200
    ApiToken.objects.update(revoked_at="2026-01-01T00:00:00Z")
    time.sleep(0.6)
    response = client.get("/api/v1/queues/")
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]["message"]


def test_an_unknown_token_is_never_cached(settings):
    settings.LAKESHORE_TOKEN_CACHE_SECONDS = 5
    client = _client("lsk_not-a-real-token")
    assert client.get("/api/v1/queues/").status_code == 401
    assert client.get("/api/v1/queues/").status_code == 401


def _heartbeat_token_queries(client, daemon_id) -> int:
    with CaptureQueriesContext(connection) as ctx:
        answer = client.post(f"/api/v1/daemons/{daemon_id}/heartbeat/", {}, format="json")
        assert answer.status_code == 200, answer.content
    return sum(
        1
        for q in ctx.captured_queries
        if "accounts_apitoken" in q["sql"] or "auth_user_groups" in q["sql"]
    )


def test_a_daemons_credential_is_kept_longer_than_other_tokens(settings):
    """An idle daemon long-polls every 20 s: with the 5 s window its own credential
    would be looked up again on every call (500 daemons: 3 times the CPU)."""
    settings.LAKESHORE_TOKEN_CACHE_SECONDS = 0
    settings.LAKESHORE_CREDENTIAL_CACHE_SECONDS = 60
    builders.queue(name="w")
    client = _client(builders.token("daemon"))
    made = builders.register(client, {"name": "d", "queues": ["w"]}).json()
    assert _heartbeat_token_queries(client, made["id"]) >= 1  # the first looks it up
    assert _heartbeat_token_queries(client, made["id"]) == 0
    settings.LAKESHORE_CREDENTIAL_CACHE_SECONDS = 0  # negative control: no window
    token_cache.clear()
    _heartbeat_token_queries(client, made["id"])
    assert _heartbeat_token_queries(client, made["id"]) >= 1
