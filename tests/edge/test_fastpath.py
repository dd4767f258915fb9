"""The lean path (edge/lean_path.py) answers the daemon protocol and submit
exactly as the full stack (middleware, DRF) does: the same status, body and headers,
request by request, through the real WSGI application. What it may not answer as
the full stack would (a bad token, a role that is refused, a form or msgpack body,
plain HTTP under LAKESHORE_HTTPS) it hands to Django untouched."""

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from accounts.authentication import token_cache
from edge.lean_path import LeanPath
from fleet import protocol
from fleet.models import Daemon
from jobs import services
from tests.support import builders
from tests.support.doors import Counting, call

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "lakeshore.functions.echo"


@pytest.fixture
def world():
    token_cache.clear()
    django = Counting()
    lean = LeanPath(django)
    builders.queue(name="w")
    daemon_token = builders.token("daemon")
    operator_token = builders.token("operator")
    status, _, body = call(
        django,
        "/api/v1/daemons/register/",
        {"name": "d", "queues": ["w"]},
        token=daemon_token,
    )
    assert status == 201
    django.calls = 0
    yield django, lean, body["id"], body["token"], operator_token  # the daemon's credential
    token_cache.clear()


def both(world, path, body=None, *, token):
    """The same request through the lean path and through Django alone; the lean one
    must not have reached Django."""
    django, lean, *_ = world
    before = django.calls
    through_lean = call(lean, path, body, token=token)
    assert django.calls == before, "the lean path handed it to Django"
    through_django = call(django, path, body, token=token)
    return through_lean, through_django


def test_an_empty_claim_answers_the_same(world):
    _, _, me, daemon, _ = world
    lean, full = both(world, f"/api/v1/daemons/{me}/claim/", {"limit": 1}, token=daemon)
    assert lean == full
    assert lean[0] == 200 and lean[2] == []


def test_claimed_work_has_the_same_shape_either_way(world):
    _, _, me, daemon, _ = world
    ids = [services.invocation_submit(function=ECHO, queue="w")[0].pk for _ in range(2)]
    (s1, h1, got1), (s2, h2, got2) = both(
        world, f"/api/v1/daemons/{me}/claim/", {"limit": 1}, token=daemon
    )
    assert (s1, h1) == (s2, h2)
    assert [int(got1[0]["id"]), int(got2[0]["id"])] == ids
    for item in (got1[0], got2[0]):
        item.pop("id"), item.pop("created_at"), item.pop("started_at"), item.pop("args")
    assert got1 == got2


@pytest.mark.parametrize(
    "route,body",
    [
        ("claim", {"limit": 0}),
        ("claim", {"limit": 1, "colour": "red"}),
        ("claim", [1, 2]),
        ("exchange", {"outcomes": [{"invocation": 1}], "limit": 1}),
        ("complete", {"invocation": 999999, "attempt": 1, "state": "succeeded"}),
        ("complete", []),
        ("heartbeat", {"held": "x"}),
    ],
)
def test_refusals_answer_the_same(world, route, body):
    _, _, me, daemon, _ = world
    lean, full = both(world, f"/api/v1/daemons/{me}/{route}/", body, token=daemon)
    assert lean == full
    assert lean[0] in (400, 404, 409)
    assert lean[2]["error"]["code"]


def test_an_unknown_daemon_and_another_tokens_daemon_answer_the_same(world):
    _, _, me, daemon, operator = world
    lean, full = both(world, "/api/v1/daemons/999999/claim/", {}, token=operator)
    assert lean == full and lean[0] == 404
    # a daemon's credential speaks for its own daemon only, whether another one exists
    # or not: refused before its body is read (issue 29)
    lean, full = both(world, "/api/v1/daemons/999999/claim/", {}, token=daemon)
    assert lean == full and lean[0] == 403
    assert lean[2]["error"]["code"] == "not_your_daemon"
    other = builders.daemon(queues=["w"])
    lean, full = both(world, f"/api/v1/daemons/{other.pk}/claim/", {}, token=daemon)
    assert lean == full and lean[0] == 403


def test_a_gone_daemon_gets_the_same_409(world):
    _, _, me, daemon, _ = world
    Daemon.objects.filter(pk=me).update(state="terminated")
    lean, full = both(world, f"/api/v1/daemons/{me}/exchange/", {"limit": 1}, token=daemon)
    assert lean == full
    assert lean[0] == 409 and lean[2]["error"]["code"] == "daemon_terminated"


def test_heartbeat_and_exchange_answer_the_same(world):
    _, _, me, daemon, _ = world
    lean, full = both(world, f"/api/v1/daemons/{me}/heartbeat/", {"held": []}, token=daemon)
    assert lean == full and lean[0] == 200
    lean, full = both(world, f"/api/v1/daemons/{me}/exchange/", {"limit": 0}, token=daemon)
    assert lean == full == (200, lean[1], {"recorded": [], "claimed": []})


def test_a_submit_answers_the_same(world):
    *_, operator = world
    body = {"function": ECHO, "queue": "w", "key": "same", "args": [1, {"a": "é"}]}
    call(world[0], "/api/v1/jobs/", body, token=operator)  # made: both answer it again
    lean, full = both(world, "/api/v1/jobs/", body, token=operator)
    assert lean == full and lean[0] == 200
    lean, full = both(world, "/api/v1/jobs/", [body, body], token=operator)
    assert lean == full and lean[0] == 200 and len(lean[2]) == 2
    lean, full = both(world, "/api/v1/jobs/", {"function": ECHO, "queue": "nope"}, token=operator)
    assert lean == full and lean[0] == 404


def test_a_failure_answers_the_same_500_and_503(world, monkeypatch):
    _, _, me, daemon, _ = world

    def broken(**kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(protocol, "claim_steps", broken)
    lean, full = both(world, f"/api/v1/daemons/{me}/claim/", {}, token=daemon)
    assert lean == full and lean[0] == 500

    def unavailable(**kwargs):
        raise OperationalError("server closed the connection")

    monkeypatch.setattr(protocol, "claim_steps", unavailable)
    lean, full = both(world, f"/api/v1/daemons/{me}/claim/", {}, token=daemon)
    assert lean == full and lean[0] == 503


# ---------------------------------------------------------------------------- handed over


def test_what_it_may_not_answer_goes_to_django(world):
    django, lean, me, daemon, operator = world
    viewer = builders.token("viewer")
    cases = [
        # a role the view refuses: DRF says 403 and why
        ("/api/v1/jobs/", {"function": ECHO, "queue": "w"}, viewer, "application/json"),
        # a bad token: 401 (and counted towards the bad-token limit)
        (f"/api/v1/daemons/{me}/claim/", {}, "nope", "application/json"),
        # not JSON
        (f"/api/v1/daemons/{me}/claim/", {}, daemon, "application/x-www-form-urlencoded"),
        # not a route of its own
        (f"/api/v1/daemons/{me}/deregister/", {}, daemon, "application/json"),
    ]
    for path, body, token, content_type in cases:
        before = django.calls
        status, _, answer = call(lean, path, body, token=token, content_type=content_type)
        assert django.calls == before + 1, path
    # and the viewer's answer is DRF's
    status, _, answer = call(lean, "/api/v1/jobs/", {"function": ECHO}, token=viewer)
    assert status == 403 and "operator" in answer["error"]["message"]


def test_json_drf_refuses_is_refused_the_same(world):
    django, lean, me, daemon, operator = world
    for path, text in [
        ("/api/v1/jobs/", '{"function": "lakeshore.functions.echo", "priority": NaN}'),
        (f"/api/v1/daemons/{me}/claim/", '{"limit": Infinity}'),
        (f"/api/v1/daemons/{me}/claim/", '{"limit": 1'),
    ]:
        token = operator if path == "/api/v1/jobs/" else daemon
        answers = [call(app, path, token=token, raw=text.encode()) for app in (lean, django)]
        assert answers[0] == answers[1] and answers[0][0] == 400, (text, answers[0])


def test_another_charset_goes_to_django(world):
    django, lean, me, daemon, _ = world
    before = django.calls
    status, _, _ = call(
        lean,
        f"/api/v1/daemons/{me}/claim/",
        {},
        token=daemon,
        content_type="application/json; charset=latin-1",
    )
    assert django.calls == before + 1 and status == 200


def test_a_host_not_allowed_goes_to_django_which_refuses_it(world):
    django, lean, me, daemon, _ = world
    before = django.calls
    status, _, answer = call(
        lean, f"/api/v1/daemons/{me}/claim/", {}, token=daemon, extra={"HTTP_HOST": "evil.example"}
    )
    assert django.calls == before + 1
    assert status == 400 and answer["error"]["code"] == "bad_host"


def test_nesting_past_the_limit_goes_to_django_which_refuses_it(world, settings):
    django, lean, me, daemon, _ = world
    settings.LAKESHORE_JSON_MAX_DEPTH = 3
    before = django.calls
    status, _, answer = call(lean, "/api/v1/jobs/", [[[[1]]]], token=world[4])
    assert django.calls == before + 1
    assert status == 400 and "nested deeper" in answer["error"]["message"]


def test_under_https_plain_http_is_redirected_and_https_gets_hsts(settings):
    settings.LAKESHORE_HTTPS = True
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SECURE_HSTS_PRELOAD = True
    token_cache.clear()
    django = Counting()
    lean = LeanPath(django)
    builders.queue(name="w")
    daemon = builders.token("daemon")
    https = {"HTTP_X_FORWARDED_PROTO": "https"}
    _, _, made = call(
        django,
        "/api/v1/daemons/register/",
        {"name": "d", "queues": ["w"]},
        token=daemon,
        extra=https,
    )
    path = f"/api/v1/daemons/{made['id']}/claim/"
    daemon = made["token"]

    status, headers, _ = call(lean, path, {}, token=daemon)  # plain http
    assert status == 301 and headers["Location"].startswith("https://")

    before = django.calls
    through_lean = call(lean, path, {}, token=daemon, extra=https)
    assert django.calls == before
    assert through_lean == call(django, path, {}, token=daemon, extra=https)
    assert through_lean[1]["Strict-Transport-Security"] == (
        "max-age=3600; includeSubDomains; preload"
    )


def test_it_can_be_turned_off(world, settings):
    django, lean, me, daemon, _ = world
    settings.LAKESHORE_LEAN_PATH = False
    before = django.calls
    call(lean, f"/api/v1/daemons/{me}/claim/", {}, token=daemon)
    assert django.calls == before + 1


def test_it_costs_the_queries_the_full_stack_costs(world):
    """The same answer function behind both doors: no query more (or fewer) either way."""
    django, lean, me, daemon, operator = world
    call(django, f"/api/v1/daemons/{me}/claim/", {}, token=daemon)  # warm: the queue's row
    for _ in range(3):  # a backlog behind both claims: the same work either way
        services.invocation_submit(function=ECHO, queue="w")
    counts = {}
    for name, app in (("lean", lean), ("full", django)):
        with CaptureQueriesContext(connection) as claim:
            status, _, got = call(app, f"/api/v1/daemons/{me}/claim/", {"limit": 1}, token=daemon)
        assert status == 200 and len(got) == 1
        outcome = {"invocation": int(got[0]["id"]), "attempt": 1, "state": "succeeded"}
        with CaptureQueriesContext(connection) as complete:
            status, _, _ = call(app, f"/api/v1/daemons/{me}/complete/", outcome, token=daemon)
        assert status == 200
        counts[name] = (len(claim), len(complete))
    assert counts["lean"] == counts["full"]
    # the token and its roles (no token cache in tests), the daemon, and the claim's
    # transaction: BEGIN, the claim (which marks the daemon busy itself), COMMIT
    assert counts["lean"][0] == 6
