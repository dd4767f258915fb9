"""One daemon, one credential (issue 17, findings 2 and 3).

Each test performs the attack through the real WSGI application, by both doors (the
lean path and Django's full stack), and asserts it is refused; its negative control
puts back the rule the server had before (a daemon token acted for every daemon its
user owned) and shows the same attack succeed."""

import time

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.utils import timezone

from accounts.authentication import token_cache
from accounts.models import ApiToken
from accounts.roles import can_operate
from edge.lean_path import LeanPath
from fleet import protocol
from fleet.api import protocol_views
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from tests.support import builders
from tests.support.doors import call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.security]

ECHO = "lakeshore.functions.echo"


def owner_rule(daemon, *, user, token):
    """The rule before issue 17: any daemon token of the daemon's owner speaks for it."""
    if daemon.owner_id != user.pk and not can_operate(user):
        raise AssertionError("the old rule refused too")
    return daemon


def no_rule_before_body(daemon_id, *, user, token, known_only=False):
    """Before issue 29 nothing was checked before the body: owner_rule decided after."""
    return True


@pytest.fixture(params=["lean", "full"])
def door(request):
    token_cache.clear()
    app = WSGIHandler()
    yield LeanPath(app) if request.param == "lean" else app
    token_cache.clear()


@pytest.fixture
def fleet(settings):
    """Two daemons a provider started on one queue, each with its own credential, the
    second running a job: what the controller makes for the local and slurm providers
    (queues/driver_base.mint_daemons; the simulated provider mints none, so the test
    mints them as those do)."""
    settings.LAKESHORE_RETRY_BACKOFF = 0
    builders.provider(name="sim", kind="simulated", config={"startup_seconds": 0})
    queue = builders.queue(name="w", provider="sim", elasticity_spec={"kind": "fixed", "min": 2})
    minted = {}
    builders.tick_queue(queue.pk)
    a, b = Daemon.objects.filter(provider__name="sim").order_by("pk")
    for daemon in (a, b):  # as a local or slurm provider mints them, owner included
        token, minted[daemon.pk] = builders.credential(daemon, username="provider-sim")
        Daemon.objects.filter(pk=daemon.pk).update(state="idle", owner=token.user)
    services.invocation_submit(function=ECHO, queue="w")
    [job] = builders.claim(daemon=Daemon.objects.get(pk=b.pk), limit=1)
    return a, b, minted, job


def test_a_daemons_credential_cannot_act_for_another_daemon_of_its_provider(door, fleet):
    a, b, minted, job = fleet
    as_a = minted[a.pk]
    attacks = [
        ("heartbeat", {"held": []}),
        ("claim", {"limit": 1}),
        ("complete", {"invocation": job.pk, "attempt": 1, "state": "succeeded", "result": 1}),
        ("exchange", {"limit": 1}),
        ("deregister", {}),
    ]
    for route, body in attacks:
        status, _, answer = call(door, f"/api/v1/daemons/{b.pk}/{route}/", body, token=as_a)
        assert (status, answer["error"]["code"]) == (403, "not_your_daemon"), route
    job.refresh_from_db()
    assert (job.state, job.daemon_id) == ("running", b.pk)  # B's work stays B's
    assert Daemon.objects.get(pk=b.pk).state != "terminated"
    # its own daemon it speaks for
    status, _, _ = call(door, f"/api/v1/daemons/{a.pk}/heartbeat/", {"held": []}, token=as_a)
    assert status == 200


def test_negative_control_under_the_owner_rule_a_heartbeat_gives_away_anothers_work(
    door, fleet, monkeypatch
):
    a, b, minted, job = fleet
    monkeypatch.setattr(protocol_views, "check_speaker", owner_rule)
    monkeypatch.setattr(protocol_views, "check_speaker_before_body", no_rule_before_body)
    status, _, _ = call(
        door, f"/api/v1/daemons/{b.pk}/heartbeat/", {"held": []}, token=minted[a.pk]
    )
    assert status == 200
    # held=[] past the grace hands B's running job back to the queue
    Invocation.objects.filter(pk=job.pk).update(started_at=job.started_at.replace(year=2000))
    call(door, f"/api/v1/daemons/{b.pk}/heartbeat/", {"held": []}, token=minted[a.pk])
    job.refresh_from_db()
    assert job.state == "queued"


def test_the_token_that_registered_a_daemon_cannot_act_as_it(door):
    builders.queue(name="w")
    bootstrap = builders.token("daemon")
    status, _, made = call(door, "/api/v1/daemons/register/", {"name": "d", "queues": ["w"]},
                           token=bootstrap)  # fmt: skip
    assert status == 201 and made["token"] != bootstrap
    status, _, refused = call(door, f"/api/v1/daemons/{made['id']}/claim/", {}, token=bootstrap)
    assert (status, refused["error"]["code"]) == (403, "not_your_daemon")
    status, _, _ = call(door, f"/api/v1/daemons/{made['id']}/claim/", {}, token=made["token"])
    assert status == 200
    # the bootstrap token registers more; a daemon's credential registers none
    status, _, _ = call(door, "/api/v1/daemons/register/", {"name": "e", "queues": ["w"]},
                        token=bootstrap)  # fmt: skip
    assert status == 201
    status, _, refused = call(door, "/api/v1/daemons/register/", {"name": "f", "queues": ["w"]},
                              token=made["token"])  # fmt: skip
    assert (status, refused["error"]["code"]) == (403, "not_your_daemon")


def test_negative_control_under_the_owner_rule_the_bootstrap_token_acts_as_its_daemons(
    door, monkeypatch
):
    builders.queue(name="w")
    bootstrap = builders.token("daemon")
    _, _, made = call(door, "/api/v1/daemons/register/", {"name": "d", "queues": ["w"]},
                      token=bootstrap)  # fmt: skip
    monkeypatch.setattr(protocol_views, "check_speaker", owner_rule)
    monkeypatch.setattr(protocol_views, "check_speaker_before_body", no_rule_before_body)
    status, _, _ = call(door, f"/api/v1/daemons/{made['id']}/claim/", {}, token=bootstrap)
    assert status == 200


def test_a_credential_dies_with_its_daemon(door):
    builders.queue(name="w")
    _, _, made = call(door, "/api/v1/daemons/register/", {"name": "d", "queues": ["w"]},
                      token=builders.token("daemon"))  # fmt: skip
    path = f"/api/v1/daemons/{made['id']}/deregister/"
    assert call(door, path, {}, token=made["token"])[0] == 200
    status, _, gone = call(door, f"/api/v1/daemons/{made['id']}/claim/", {}, token=made["token"])
    assert (status, gone["error"]["code"]) == (401, "token_revoked")


def test_an_operator_still_speaks_for_any_daemon(door):
    builders.queue(name="w")
    _, _, made = call(door, "/api/v1/daemons/register/", {"name": "d", "queues": ["w"]},
                      token=builders.token("daemon"))  # fmt: skip
    status, _, _ = call(
        door, f"/api/v1/daemons/{made['id']}/heartbeat/", {}, token=builders.token("operator")
    )
    assert status == 200


@pytest.mark.parametrize("noted_on_arrival", [True, False])
def test_a_revocation_between_the_credentials_read_and_the_wait_still_wakes_it(
    door, settings, monkeypatch, noted_on_arrival
):
    """The forced interleaving (seen in CI): the claim's credential is read (usable),
    then its revocation commits and is heard, and only then does the claim look and
    wait. With the daemon's channel noted as the request arrived (the server's way) the
    wait wakes at once and answers 401 token_revoked: the daemon stops. Without the
    note (the control, as before) the revocation predates the wait's snapshot, and
    the claim sleeps through its whole wait and answers 200, nothing claimed."""
    settings.LAKESHORE_TOKEN_CACHE_SECONDS = 0
    builders.queue(name="w")
    _, _, made = call(door, "/api/v1/daemons/register/", {"name": "d", "queues": ["w"]},
                      token=builders.token("daemon"))  # fmt: skip
    channel = f"daemon:{made['id']}"
    token_id = Daemon.objects.get(pk=made["id"]).token_id
    checked = protocol_views.check_speaker_before_body

    def revoked_once_read(daemon_id, **kwargs):
        before = protocol.wakeup.listener.snapshot([channel])[0]
        ApiToken.objects.filter(pk=token_id).update(revoked_at=timezone.now())
        deadline = time.monotonic() + 10
        while protocol.wakeup.listener.snapshot([channel])[0] == before:
            assert time.monotonic() < deadline, "the revocation was never heard"
            time.sleep(0.01)
        return checked(daemon_id, **kwargs)

    # what both doors ask before the body, after the credential was read
    monkeypatch.setattr(protocol_views, "check_speaker_before_body", revoked_once_read)
    if not noted_on_arrival:
        # the old order: the channel as it stands after the credential was read
        monkeypatch.setattr(
            protocol,
            "heard_on_arrival",
            lambda environ, daemon_id: protocol.daemon_heard(daemon_id),
        )
    wait = 8
    started = time.monotonic()
    status, _, answer = call(
        door, f"/api/v1/daemons/{made['id']}/claim/", {"wait": wait}, token=made["token"]
    )
    took = time.monotonic() - started
    if noted_on_arrival:
        assert (status, answer["error"]["code"]) == (401, "token_revoked")
        assert took < wait / 2  # at once, not at its wait's end
    else:
        assert (status, answer, took >= wait - 0.5) == (200, [], True)
