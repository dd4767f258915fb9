"""Bad bearer tokens from one address get 429 past a limit; good tokens never do. An
optional request rate for the whole API (LAKESHORE_API_RATE)."""

import runpy
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from rest_framework.test import APIClient
from rest_framework.throttling import UserRateThrottle
from rest_framework.views import APIView

from accounts.services import token_create
from accounts.throttles import BadTokenThrottle
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

URL = "/api/v1/queues/"


@pytest.fixture
def limit(settings):
    settings.LAKESHORE_BAD_TOKEN_LIMIT = 3
    settings.LAKESHORE_BAD_TOKEN_WINDOW = 60
    return 3


BAD = "lsk_not-a-real-token"


def get(token: str = BAD, *, address: str = "127.0.0.1", **headers):
    auth = f"Bearer {token}"
    return APIClient().get(URL, HTTP_AUTHORIZATION=auth, REMOTE_ADDR=address, **headers)


def test_it_answers_429_after_the_limit_with_the_error_body_and_retry_after(limit):
    for _ in range(limit):
        assert_error(get(), 401, "authentication_failed", says="invalid token")

    response = get()

    error = assert_error(response, 429, "throttled", says="try again in")
    assert error["fields"] == {}
    wait = int(response["Retry-After"])
    assert 0 < wait <= 60
    assert error["message"].endswith(f"try again in {wait} s.")


def test_the_default_limit_is_20_a_minute():
    assert (settings.LAKESHORE_BAD_TOKEN_LIMIT, settings.LAKESHORE_BAD_TOKEN_WINDOW) == (20, 60)
    assert all(get().status_code == 401 for _ in range(20))
    assert get().status_code == 429


def test_a_good_token_from_the_same_address_is_never_held_back(limit):
    good = builders.token("viewer")
    for _ in range(limit + 2):
        get()
    assert get().status_code == 429

    assert get(good).status_code == 200
    assert get(good).status_code == 200
    assert get().status_code == 429


def test_other_addresses_are_not_held_back(limit):
    for _ in range(limit + 1):
        get()
    assert get(address="10.0.0.7").status_code == 401


def test_a_forged_forwarded_for_header_does_not_escape_the_count(limit):
    for i in range(limit):
        get(HTTP_X_FORWARDED_FOR=f"10.9.9.{i}")
    assert get(HTTP_X_FORWARDED_FOR="10.9.9.99").status_code == 429


def test_behind_a_proxy_it_counts_the_forwarded_address(limit, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    for _ in range(limit + 1):
        get(HTTP_X_FORWARDED_FOR="203.0.113.5")
    assert get(HTTP_X_FORWARDED_FOR="203.0.113.5").status_code == 429
    assert get(HTTP_X_FORWARDED_FOR="203.0.113.6").status_code == 401


def test_revoked_expired_and_malformed_tokens_count_too(limit):
    token, raw = token_create(username="carol", role="viewer")
    token.revoke()
    get(raw)
    APIClient().get(URL, HTTP_AUTHORIZATION="Bearer two words")
    get()
    assert_error(get(raw), 429, "throttled")


def test_it_lets_bad_tokens_be_refused_again_once_the_window_has_passed(limit, monkeypatch):
    for _ in range(limit + 1):
        get()
    assert get().status_code == 429

    later = BadTokenThrottle.timer() + 61
    monkeypatch.setattr(BadTokenThrottle, "timer", lambda self: later)
    assert get().status_code == 401


def test_a_limit_of_zero_turns_it_off(settings):
    settings.LAKESHORE_BAD_TOKEN_LIMIT = 0
    assert all(get().status_code == 401 for _ in range(30))


def test_no_token_at_all_is_a_plain_401_and_is_not_counted(limit, api):
    for _ in range(limit + 2):
        assert_error(api.get(URL), 401, "not_authenticated")
    assert get().status_code == 401


def test_an_api_rate_limits_every_request_when_set(monkeypatch):
    # what LAKESHORE_API_RATE=2/min sets up (DRF reads both when it is imported)
    monkeypatch.setattr(APIView, "throttle_classes", [UserRateThrottle])
    monkeypatch.setattr(UserRateThrottle, "THROTTLE_RATES", {"user": "2/min"})
    first, other = builders.token("viewer"), builders.token("viewer")
    assert [get(first).status_code for _ in range(3)] == [200, 200, 429]
    assert_error(get(first), 429, "throttled")
    assert get(other).status_code == 200  # per user


def test_there_is_no_api_rate_by_default():
    assert "DEFAULT_THROTTLE_CLASSES" not in settings.REST_FRAMEWORK
    token = builders.token("viewer")
    assert all(get(token).status_code == 200 for _ in range(30))


def load_settings(monkeypatch, tmp_path, **env):
    """The real settings file run afresh with `env`; the DATABASE_URL is only parsed."""
    monkeypatch.setenv("DATABASE_URL", "postgres://u@127.0.0.1:1/none")
    monkeypatch.setenv("LAKESHORE_VAR_DIR", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(Path(settings.BASE_DIR) / "lakeshore_admin" / "settings.py"))


@pytest.mark.django_db(False)
def test_the_environment_sets_the_limits(monkeypatch, tmp_path):
    loaded = load_settings(
        monkeypatch,
        tmp_path,
        LAKESHORE_BAD_TOKEN_LIMIT="5",
        LAKESHORE_BAD_TOKEN_WINDOW="300",
        LAKESHORE_API_RATE="600/min",
        LAKESHORE_PROXY_COUNT="1",
    )
    assert (loaded["LAKESHORE_BAD_TOKEN_LIMIT"], loaded["LAKESHORE_BAD_TOKEN_WINDOW"]) == (5, 300)
    rest = loaded["REST_FRAMEWORK"]
    assert rest["DEFAULT_THROTTLE_CLASSES"] == ["rest_framework.throttling.UserRateThrottle"]
    assert rest["DEFAULT_THROTTLE_RATES"] == {"user": "600/min"}
    assert rest["NUM_PROXIES"] == 1


@pytest.mark.django_db(False)
@pytest.mark.parametrize(
    "name, value",
    [
        ("LAKESHORE_API_RATE", "lots"),
        ("LAKESHORE_API_RATE", "10/fortnight"),
        ("LAKESHORE_BAD_TOKEN_LIMIT", "-1"),
        ("LAKESHORE_BAD_TOKEN_WINDOW", "0"),
        ("LAKESHORE_PROXY_COUNT", "x"),
    ],
)
def test_a_bad_value_names_the_variable(monkeypatch, tmp_path, name, value):
    with pytest.raises(ImproperlyConfigured, match=name):
        load_settings(monkeypatch, tmp_path, **{name: value})
