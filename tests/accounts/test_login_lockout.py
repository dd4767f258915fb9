"""Failed logins lock that user name from that address for a while (django-axes), on the
console's login page and Django admin's alike."""

import runpy
from datetime import timedelta
from pathlib import Path

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db.models import F

pytestmark = pytest.mark.django_db

PASSWORD = "the-right-password"


@pytest.fixture(autouse=True)
def users():
    get_user_model().objects.create_user("alice", password=PASSWORD)
    get_user_model().objects.create_user("bob", password=PASSWORD)


def log_in(client, username="alice", password=PASSWORD, *, address="127.0.0.1", url="/login/"):
    return client.post(
        url, {"username": username, "password": password, "next": "/"}, REMOTE_ADDR=address
    )


def fail(client, times, **kwargs):
    return [log_in(client, password="wrong", **kwargs) for _ in range(times)]


def assert_logged_in(response):
    assert response.status_code == 302 and response["Location"] == "/", response.status_code


def assert_locked(response, username="alice"):
    body = response.content.decode()
    assert response.status_code == 429
    assert "Login locked" in body and f"<strong>{username}</strong>" in body
    assert "locked" in body and "for 15 minutes" in body
    assert "Traceback" not in body


def test_the_defaults_are_five_failures_and_fifteen_minutes():
    limit, cool_off = settings.AXES_FAILURE_LIMIT, settings.AXES_COOLOFF_TIME
    assert (limit, cool_off) == (5, timedelta(minutes=15))
    assert settings.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]


def test_a_few_bad_passwords_only_show_the_form_again(client):
    for response in fail(client, 4):
        assert response.status_code == 200
        assert "didn't match" in response.content.decode()
    assert_logged_in(log_in(client))


def test_the_fifth_failure_locks_and_the_right_password_is_refused_after(client):
    *first, fifth = fail(client, 5)

    assert all(r.status_code == 200 for r in first)
    assert_locked(fifth)
    sixth = log_in(client)
    assert_locked(sixth)
    assert "_auth_user_id" not in client.session
    assert client.get("/").status_code == 302  # still not logged in


def test_the_lock_holds_on_the_admin_login_too(client):
    fail(client, 5)
    response = log_in(client, url="/admin/login/?next=/admin/")
    assert_locked(response)
    assert "_auth_user_id" not in client.session


def test_another_user_from_the_same_address_is_not_locked(client):
    fail(client, 5)
    assert_logged_in(log_in(client, "bob"))


def test_the_same_user_from_another_address_is_not_locked(client):
    fail(client, 5)
    assert_logged_in(log_in(client, address="10.1.2.3"))


def test_it_works_again_after_the_cool_off(client):
    fail(client, 5)
    assert_locked(log_in(client))

    AccessAttempt.objects.update(
        attempt_time=F("attempt_time") - settings.AXES_COOLOFF_TIME - timedelta(seconds=1)
    )
    assert_logged_in(log_in(client))


def test_an_admin_unlocks_at_once(client):
    fail(client, 5)
    call_command("axes_reset_username", "alice", verbosity=0)
    assert_logged_in(log_in(client))


def test_a_good_login_clears_the_count(client):
    fail(client, 4)
    assert_logged_in(log_in(client))
    client.logout()
    assert all(r.status_code == 200 for r in fail(client, 4))
    assert_logged_in(log_in(client))


def test_the_limit_and_cool_off_follow_the_settings(client, settings):
    settings.AXES_FAILURE_LIMIT = 2
    settings.AXES_COOLOFF_TIME = timedelta(minutes=1)
    *_, second = fail(client, 2)
    assert second.status_code == 429
    assert "for 1 minute." in second.content.decode()


@pytest.mark.django_db(False)
def test_the_environment_sets_the_limit_and_cool_off(monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", "postgres://u@127.0.0.1:1/none")  # parsed only
    monkeypatch.setenv("LAKESHORE_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("LAKESHORE_LOGIN_FAILURE_LIMIT", "3")
    monkeypatch.setenv("LAKESHORE_LOGIN_COOLOFF_MINUTES", "60")
    loaded = runpy.run_path(str(Path(settings.BASE_DIR) / "lakeshore_admin" / "settings.py"))
    assert loaded["AXES_FAILURE_LIMIT"] == 3
    assert loaded["AXES_COOLOFF_TIME"] == timedelta(hours=1)
