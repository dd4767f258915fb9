"""The lean path's contract with the framework it skips (edge/lean_path.py):
every middleware in settings.MIDDLEWARE is accounted for, a middleware it does not
know turns it off, and every security header Django can send comes out of it the
same. A new middleware, or a Django with a new security setting, fails here until the
lean path says what it does in its place."""

import re

import pytest
from django.conf import global_settings, settings

from accounts.authentication import token_cache
from edge.lean_path import ACCOUNTED, LeanPath, unaccounted
from tests.support import builders
from tests.support.doors import Counting, call

pytestmark = pytest.mark.django_db(transaction=True)

HTTPS = {"wsgi.url_scheme": "https", "SERVER_PORT": "443"}

# Each of Django's security settings: the header it makes the middleware send, the value
# it is set to here, or None for a setting that sends no header of its own (the lean
# path then hands the request to Django, or the setting shapes another's header).
SECURITY_SETTINGS = {
    "SECURE_CONTENT_TYPE_NOSNIFF": ("X-Content-Type-Options", True),
    "SECURE_CROSS_ORIGIN_OPENER_POLICY": ("Cross-Origin-Opener-Policy", "same-origin"),
    "SECURE_CSP": ("Content-Security-Policy", {"default-src": ["'self'"]}),
    "SECURE_CSP_REPORT_ONLY": (
        "Content-Security-Policy-Report-Only",
        {"default-src": ["'none'"], "report-uri": "/csp/"},
    ),
    "SECURE_HSTS_SECONDS": ("Strict-Transport-Security", 600),
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": None,  # part of the HSTS header
    "SECURE_HSTS_PRELOAD": None,  # part of the HSTS header
    "SECURE_PROXY_SSL_HEADER": None,  # what counts as HTTPS (tested in test_fastpath)
    "SECURE_REDIRECT_EXEMPT": None,  # plain HTTP under the redirect goes to Django
    "SECURE_REFERRER_POLICY": ("Referrer-Policy", "no-referrer"),
    "SECURE_SSL_HOST": None,  # plain HTTP under the redirect goes to Django
    "SECURE_SSL_REDIRECT": None,  # plain HTTP under the redirect goes to Django
    "X_FRAME_OPTIONS": ("X-Frame-Options", "SAMEORIGIN"),
}


class Stamp:
    """A middleware the lean path knows nothing of: it adds a header."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        response["X-Stamp"] = "stamped"
        return response


@pytest.fixture
def heartbeat():
    """A registered daemon; called after the test's settings, (Django alone, the lean
    path in front of it, the daemon's heartbeat path, its token)."""
    token_cache.clear()
    builders.queue(name="w")
    _, _, me = call(
        Counting(),
        "/api/v1/daemons/register/",
        {"name": "d", "queues": ["w"]},
        token=builders.token("daemon"),
        extra=HTTPS,
    )

    def make():
        django = Counting()  # its middleware built from the test's settings
        return django, LeanPath(django), f"/api/v1/daemons/{me['id']}/heartbeat/", me["token"]

    yield make
    token_cache.clear()


def both(django, lean, path, token):
    before = django.calls
    through_lean = call(lean, path, {"held": []}, token=token, extra=HTTPS)
    took = django.calls == before
    return took, through_lean, call(django, path, {"held": []}, token=token, extra=HTTPS)


def test_every_middleware_in_the_settings_is_accounted_for():
    assert unaccounted(settings.MIDDLEWARE) == [], (
        "the lean path does not know these middlewares: say in fastpath.ACCOUNTED what it "
        "does in their place (or hand such requests to Django)"
    )
    assert sorted(set(ACCOUNTED) - set(settings.MIDDLEWARE)) == [], "stale entries"


def test_a_middleware_it_does_not_know_turns_it_off(heartbeat, settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.edge.test_fastpath_contract.Stamp"]
    django, lean, path, token = heartbeat()
    took, through_lean, through_django = both(django, lean, path, token)
    assert not took, "the lean path answered past a middleware it does not know"
    assert through_lean == through_django
    assert through_lean[1]["X-Stamp"] == "stamped"


def test_the_control_without_it_takes_the_request(heartbeat):
    django, lean, path, token = heartbeat()
    took, through_lean, through_django = both(django, lean, path, token)
    assert took and through_lean == through_django
    assert "X-Stamp" not in through_lean[1]


def test_every_security_setting_of_django_is_known_here():
    known = {name for name in dir(global_settings) if name.startswith("SECURE_")}
    assert sorted(known | {"X_FRAME_OPTIONS"}) == sorted(SECURITY_SETTINGS), (
        "Django has security settings this test (and the lean path) do not know"
    )


@pytest.mark.parametrize(
    "name", [name for name, header in SECURITY_SETTINGS.items() if header is not None]
)
def test_each_security_header_comes_out_the_same(heartbeat, settings, name):
    header, value = SECURITY_SETTINGS[name]
    for other, made in SECURITY_SETTINGS.items():  # only this one on
        if made is not None and other != "X_FRAME_OPTIONS":  # that one is always sent
            setattr(settings, other, False if other == "SECURE_CONTENT_TYPE_NOSNIFF" else None)
    setattr(settings, name, value)
    django, lean, path, token = heartbeat()
    took, through_lean, through_django = both(django, lean, path, token)
    assert took
    assert header in through_django[1], f"{name} made Django send no {header}"
    assert through_lean == through_django


def test_all_of_them_at_once(heartbeat, settings):
    for name, made in SECURITY_SETTINGS.items():
        if made is not None:
            setattr(settings, name, made[1])
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = settings.SECURE_HSTS_PRELOAD = True
    django, lean, path, token = heartbeat()
    took, through_lean, through_django = both(django, lean, path, token)
    assert took and through_lean == through_django
    sent = set(through_lean[1])
    assert {made[0] for made in SECURITY_SETTINGS.values() if made} <= sent


@pytest.mark.parametrize(
    "name,value",
    [
        ("DISALLOWED_USER_AGENTS", [re.compile("^curl/")]),
        ("PREPEND_WWW", True),
        ("LAKESHORE_API_RATE", "5/s"),
    ],
)
def test_what_only_django_answers_goes_to_django(heartbeat, settings, name, value):
    setattr(settings, name, value)
    django, lean, path, token = heartbeat()
    before = django.calls
    environ_extra = {**HTTPS, "HTTP_USER_AGENT": "curl/8"}
    status, _, _ = call(lean, path, {"held": []}, token=token, extra=environ_extra)
    assert django.calls == before + 1
    if name == "DISALLOWED_USER_AGENTS":
        assert status == 403
    if name == "PREPEND_WWW":
        assert status == 301
