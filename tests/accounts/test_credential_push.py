"""A daemon's own credential is kept in its server process's token cache while that
process hears every change of tokens and users (accounts/migrations/0006, heard by
jobs/wakeup.py's listener), longer than LAKESHORE_CREDENTIAL_CACHE_SECONDS: an idle
daemon's every poll then costs no token query. A change that matters (the token
revoked, its user deactivated) drops it at once; one that does not (the token used)
keeps it; and when the listener loses its connection (killed here by PostgreSQL) the
entries fall back to the shorter time, since changes may have gone unheard."""

import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.authentication import token_cache
from accounts.models import ApiToken
from fleet.models import Daemon
from jobs.wakeup import listener
from tests.support import builders

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.security]


@pytest.fixture
def daemon(settings):
    settings.LAKESHORE_TOKEN_CACHE_SECONDS = 0
    settings.LAKESHORE_CREDENTIAL_CACHE_SECONDS = 1  # the time kept when not watched
    token_cache.clear()
    _until(lambda: listener.healthy)
    builders.queue(name="w")
    client = APIClient(SERVER_NAME="localhost")
    client.credentials(**builders.auth(builders.token("daemon")))
    made = builders.register(client, {"name": "d", "queues": ["w"]}).json()
    yield client, made["id"]
    token_cache.clear()


def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _heartbeat(client, daemon_id):
    """(status, error code, token queries) of one heartbeat."""
    with CaptureQueriesContext(connection) as ctx:
        answer = client.post(f"/api/v1/daemons/{daemon_id}/heartbeat/", {}, format="json")
    looked = sum(1 for q in ctx.captured_queries if "accounts_apitoken" in q["sql"])
    code = answer.json().get("error", {}).get("code") if answer.status_code >= 400 else None
    return answer.status_code, code, looked


def _own_token(daemon_id) -> ApiToken:
    return Daemon.objects.select_related("token").get(pk=daemon_id).token


def test_a_watched_credential_is_kept_and_a_revocation_drops_it_at_once(daemon):
    client, me = daemon
    assert _heartbeat(client, me)[2] >= 1  # the first looks it up
    time.sleep(1.5)  # past LAKESHORE_CREDENTIAL_CACHE_SECONDS: kept while watched
    assert _heartbeat(client, me) == (200, None, 0)
    # a change that does not matter (the token used) keeps it
    ApiToken.objects.filter(pk=_own_token(me).pk).update(last_used_at=timezone.now())
    time.sleep(0.5)
    assert _heartbeat(client, me) == (200, None, 0)
    # its revocation (a bare UPDATE: the trigger, not the service, tells) drops it
    ApiToken.objects.filter(pk=_own_token(me).pk).update(revoked_at=timezone.now())
    _until(lambda: _heartbeat(client, me)[0] == 401, timeout=30.0)  # not its watched 600 s
    assert _heartbeat(client, me)[:2] == (401, "token_revoked")


def test_its_users_deactivation_drops_it_at_once(daemon):
    client, me = daemon
    _heartbeat(client, me)
    assert _heartbeat(client, me) == (200, None, 0)
    user = _own_token(me).user_id
    get_user_model().objects.filter(pk=user).update(is_active=False)
    _until(lambda: _heartbeat(client, me)[0] == 401, timeout=30.0)  # not its watched 600 s


def test_a_listener_that_lost_its_connection_no_longer_vouches(daemon):
    """PostgreSQL ends the listening connection: changes may have gone unheard, so the
    credential is kept only its shorter time and then looked up again."""
    client, me = daemon
    _heartbeat(client, me)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
        )
        assert cursor.fetchall(), "no listening connection to end"
    _until(lambda: not listener.healthy)
    _until(lambda: listener.healthy)
    time.sleep(1.2)  # past the shorter time
    assert _heartbeat(client, me)[2] >= 1  # looked up again
    time.sleep(1.2)
    assert _heartbeat(client, me) == (200, None, 0)  # and watched again from then


def test_a_change_heard_while_the_token_was_read_keeps_it_only_the_shorter_time(daemon):
    """The race: the token is read (still valid), its revocation is heard, and only then
    is it cached. It must not be kept for the longer time on the strength of that read."""
    token = _own_token(daemon[1])
    seen = token_cache.changes
    token_cache.forget(token_id=token.pk)  # heard between the read and the put
    token_cache.put("raced", token, 0.3, watched=600, seen=seen)
    token_cache.put("calm", token, 0.3, watched=600, seen=token_cache.changes)
    assert token_cache.get("raced") is token and token_cache.get("calm") is token
    time.sleep(0.4)
    assert token_cache.get("raced") is None
    assert token_cache.get("calm") is token  # the control: watched, it stays
