"""Who may do what: bearer tokens (hashed at rest) and the viewer/operator/daemon roles."""

import io
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken, hash_token
from accounts.services import token_create
from fleet.models import Provider
from queues.models import Queue
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

READS = [
    "/api/v1/queues/",
    "/api/v1/queues/q/",
    "/api/v1/queues/q/events/",
    "/api/v1/queues/q/stats/",
    "/api/v1/providers/",
    "/api/v1/providers/p/",
    "/api/v1/daemons/",
    "/api/v1/daemons/{daemon}/",
]
ACTS = [
    ("post", "/api/v1/queues/", {"name": "new-queue"}),
    ("patch", "/api/v1/queues/q/", {"description": "changed"}),
    ("delete", "/api/v1/queues/q/", None),
    ("post", "/api/v1/queues/q/drain/", None),
    ("post", "/api/v1/queues/q/pause/", None),
    ("post", "/api/v1/queues/q/resume/", None),
    ("post", "/api/v1/queues/q/archive/", None),
    ("post", "/api/v1/queues/q/unarchive/", None),
    ("post", "/api/v1/providers/", {"name": "new-provider", "kind": "local"}),
    ("patch", "/api/v1/providers/p/", {"description": "changed"}),
    ("delete", "/api/v1/providers/p/", None),
]
REGISTER = ("post", "/api/v1/daemons/register/", {"name": "w", "queues": []})
ALL = [("get", url, None) for url in READS] + ACTS + [REGISTER]


@pytest.fixture
def world():
    """One of everything, so that every URL names something that exists."""
    builders.provider(name="p")
    builders.queue(name="q")
    return {"daemon": builders.daemon(queues=["q"]).pk}


def call(client, method: str, url: str, body, world):
    return getattr(client, method)(url.format(**world), body, format="json")


def client_with(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(**builders.auth(raw))
    return client


def assert_unchanged():
    queue = Queue.objects.get(name="q")
    assert (queue.state, queue.description) == ("active", "")
    assert list(Provider.objects.values_list("name", "description")) == [("p", "")]
    assert not Queue.objects.filter(name="new-queue").exists()


@pytest.mark.parametrize("url", READS)
def test_a_viewer_reads_everything(viewer, world, url):
    response = viewer.get(url.format(**world))

    assert response.status_code == 200, response.json()


@pytest.mark.parametrize("method, url, body", ACTS)
def test_a_viewer_may_not_act(viewer, world, method, url, body):
    response = call(viewer, method, url, body, world)

    assert_error(response, 403, "permission_denied", says="operator role")
    assert_unchanged()


@pytest.mark.parametrize("method, url, body", ACTS)
def test_an_operator_may_act(operator, world, method, url, body):
    if method == "delete" and "providers" in url:
        Queue.objects.filter(name="q").update(provider=None)
    if method == "delete" and "queues" in url:
        url += "?force=true"

    response = call(operator, method, url, body, world)

    assert response.status_code in (200, 201, 204), response.content


@pytest.mark.parametrize("method, url, body", ALL)
def test_no_token_answers_401_with_a_bearer_challenge(api, world, method, url, body):
    response = call(api, method, url, body, world)

    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert_unchanged()


@pytest.mark.parametrize("method, url, body", ALL)
def test_a_garbage_token_answers_401(world, method, url, body):
    response = call(client_with("lsk_not-a-real-token"), method, url, body, world)

    assert_error(response, 401, "authentication_failed", says="invalid token")
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert_unchanged()


def test_a_malformed_authorization_header_answers_401(api, world):
    api.credentials(HTTP_AUTHORIZATION="Bearer two words")

    response = api.get("/api/v1/queues/")

    assert_error(response, 401, "authentication_failed", says="Bearer <token>")


def test_a_revoked_token_answers_401_saying_so(world):
    token, raw = token_create(username="carol", role="operator")
    client = client_with(raw)
    assert client.get("/api/v1/queues/").status_code == 200

    token.revoke()
    response = client.get("/api/v1/queues/")

    assert_error(response, 401, "token_revoked", says="revoked")
    assert token.prefix in response.json()["error"]["message"]


def test_an_expired_token_answers_401_saying_so(world):
    _, raw = token_create(
        username="carol", role="operator", expires_at=timezone.now() - timedelta(seconds=1)
    )

    response = client_with(raw).get("/api/v1/queues/")

    assert_error(response, 401, "token_expired", says="expired")


def test_a_token_of_a_disabled_user_answers_401(world):
    raw = builders.token("operator", username="dave")
    get_user_model().objects.filter(username="dave").update(is_active=False)

    response = client_with(raw).get("/api/v1/queues/")

    assert_error(response, 401, "authentication_failed", says="disabled")


@pytest.mark.parametrize("method, url, body", [("get", url, None) for url in READS] + ACTS)
def test_a_daemon_token_may_not_use_the_queue_api(world, method, url, body):
    response = call(client_with(builders.token("daemon")), method, url, body, world)

    assert_error(response, 403, "permission_denied")
    assert_unchanged()


def test_create_token_prints_only_a_working_token(world):
    out = io.StringIO()

    call_command("create_token", "--user", "bob", "--role", "viewer", stdout=out)

    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    raw = lines[0]
    assert raw.startswith("lsk_")
    assert len(raw) > 30
    assert client_with(raw).get("/api/v1/queues/").status_code == 200
    assert client_with(raw).post("/api/v1/queues/q/drain/").status_code == 403
    assert get_user_model().objects.filter(username="bob").exists()


def test_the_database_never_holds_the_raw_token(world):
    out = io.StringIO()
    call_command("create_token", "--user", "bob", "--role", "operator", stdout=out)
    raw = out.getvalue().strip()

    token = ApiToken.objects.get(user__username="bob")

    assert token.digest == hash_token(raw)
    assert token.digest != raw
    for field in ApiToken._meta.concrete_fields:
        value = str(field.value_from_object(token))
        assert raw not in value, field.name
        assert raw[12:] not in value, field.name  # nothing beyond the shown prefix


def test_a_user_may_hold_several_tokens(world):
    first = builders.token("viewer", username="erin")
    second = builders.token("viewer", username="erin")

    assert first != second
    assert ApiToken.objects.filter(user__username="erin").count() == 2
    assert client_with(first).get("/api/v1/queues/").status_code == 200
    assert client_with(second).get("/api/v1/queues/").status_code == 200
    ApiToken.objects.get(digest=hash_token(first)).revoke()
    assert client_with(first).get("/api/v1/queues/").status_code == 401
    assert client_with(second).get("/api/v1/queues/").status_code == 200
