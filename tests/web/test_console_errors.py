"""403, 404 and 500 are pages of the console (its nav, the message); under /api/ the
errors stay the API's JSON bodies."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.template import loader
from django.test import RequestFactory

from accounts.roles import grant
from queues import services
from queues.views import server_error
from tests.support import builders

pytestmark = pytest.mark.django_db

NAV = [
    "<nav>",
    'href="/"[^>]*>Queues</a>',
    'href="/jobs/"[^>]*>Jobs</a>',
    'href="/daemons/"[^>]*>Daemons</a>',
]


@pytest.fixture
def viewer(client):
    user = get_user_model().objects.create_user("vera", password="pw-for-tests-only")
    grant(user, "viewer")
    client.force_login(user)
    client.raise_request_exception = False
    return client


def assert_console_page(body: str, message: str):
    for piece in NAV:
        assert re.search(piece, body), piece
    assert 'role="alert"' in body and message in body.replace("&#x27;", "'"), body


def test_a_missing_queue_is_a_console_page_with_the_message(viewer):
    response = viewer.get("/queues/nope/")

    assert response.status_code == 404
    body = response.content.decode()
    assert_console_page(body, "Queue 'nope' does not exist.")
    assert "<title>Not found · Lakeshore Admin</title>" in body
    assert "vera" in body  # the logged-in user, as on every page


def test_an_unknown_address_says_there_is_no_page_there(viewer):
    response = viewer.get("/no/such/page/")
    assert response.status_code == 404
    body = response.content.decode()
    assert_console_page(body, "There is no page at /no/such/page/.")
    assert "Resolver404" not in body


def test_a_visitor_gets_the_404_page_too(client):
    response = client.get("/no/such/page/")
    assert response.status_code == 404
    assert_console_page(response.content.decode(), "There is no page at /no/such/page/.")


def test_the_404_page_escapes_the_address(viewer):
    body = viewer.get("/<script>x</script>/").content.decode()
    assert "<script>x</script>" not in body


def test_the_api_still_answers_json(client):
    viewer = builders.auth(builders.token("viewer"))

    missing = client.get("/api/v1/queues/nope/", **viewer)
    assert missing.status_code == 404
    assert missing["Content-Type"] == "application/json"
    assert missing.json()["error"]["code"] == "not_found"
    assert missing.json()["error"]["message"] == "Queue 'nope' does not exist."

    nowhere = client.get("/api/v1/nowhere/", **viewer)
    assert nowhere.status_code == 404 and nowhere["Content-Type"] == "application/json"
    assert nowhere.json()["error"]["code"] == "not_found"


def _raise(exc):
    def view(*args, **kwargs):
        raise exc

    return view


def test_a_server_error_is_a_console_page(viewer, monkeypatch):
    builders.queue(name="train")
    monkeypatch.setattr(services, "queue_stats", _raise(RuntimeError("boom")))

    response = viewer.get("/queues/train/")

    assert response.status_code == 500
    body = response.content.decode()
    assert_console_page(body, "The server failed; the error was logged.")
    assert "<title>Server error · Lakeshore Admin</title>" in body
    assert "boom" not in body and "Traceback" not in body


def test_a_server_error_under_the_api_stays_json(client, monkeypatch):
    builders.queue(name="train")
    monkeypatch.setattr(services, "queue_stats", _raise(RuntimeError("boom")))
    client.raise_request_exception = False

    response = client.get("/api/v1/queues/train/stats/", **builders.auth(builders.token("viewer")))

    assert response.status_code == 500
    assert response.json()["error"]["code"] == "server_error"


def test_the_500_page_needs_no_database_and_no_user(django_assert_num_queries):
    with django_assert_num_queries(0):
        response = server_error(RequestFactory().get("/queues/train/"))
    assert response.status_code == 500
    assert_console_page(response.content.decode(), "The server failed")


def test_a_500_page_that_cannot_render_falls_back_to_plain_html(monkeypatch):
    monkeypatch.setattr(loader, "render_to_string", _raise(RuntimeError("template broke")))
    response = server_error(RequestFactory().get("/"))
    assert response.status_code == 500
    assert "The server failed; the error was logged." in response.content.decode()


def test_a_permission_refused_elsewhere_is_the_console_403_page(viewer, monkeypatch):
    builders.queue(name="train")
    monkeypatch.setattr(services, "queue_stats", _raise(PermissionDenied("Not on Sundays.")))

    response = viewer.get("/queues/train/")

    assert response.status_code == 403
    body = response.content.decode()
    assert_console_page(body, "Not on Sundays.")
    assert "<title>Not allowed · Lakeshore Admin</title>" in body
    assert "create_token" not in body  # no role to grant: it was not a role's refusal


def test_the_role_403_page_is_a_console_page_too(client):
    user = get_user_model().objects.create_user("nobody", password="pw-for-tests-only")
    client.force_login(user)
    response = client.get("/")
    assert response.status_code == 403
    assert_console_page(response.content.decode(), "Reading needs the viewer or operator role.")
