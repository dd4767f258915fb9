"""A provider-minted daemon token lives exactly as long as its daemon."""

import pytest

from accounts.models import ApiToken
from accounts.services import token_create
from fleet import daemons, registration
from fleet import services as fleet_services
from fleet.driver_base import DRIVERS
from fleet.models import Daemon
from queues.models import QueueEvent
from tests.support import builders

pytestmark = pytest.mark.django_db


def _minted(provider="sim", queues=("w",)):
    daemon = builders.daemon(
        queues=list(queues), provider_id=fleet_services.provider_get(provider).pk
    )
    token, _ = builders.credential(daemon, username=f"provider-{provider}")
    return daemon, token


@pytest.fixture
def pool():
    builders.provider(name="sim", kind="simulated")
    builders.queue(name="w")


@pytest.mark.parametrize("end", [daemons.daemon_drop, daemons.daemon_deregister])
def test_it_revokes_the_token_when_the_daemon_ends(pool, end):
    daemon, token = _minted()
    end(daemon=daemon)
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_it_keeps_the_token_of_a_lost_daemon_which_may_come_back(pool):
    daemon, token = _minted()
    Daemon.objects.filter(pk=daemon.pk).update(state="lost")
    token.refresh_from_db()
    assert token.revoked_at is None


def test_a_daemon_registering_again_with_its_minted_token_keeps_it_tied(pool):
    daemon, token = _minted()
    Daemon.objects.filter(pk=daemon.pk).update(state="lost")
    again, credential = registration.daemon_register(
        owner=token.user, name="d2", queues=["w"], token=token
    )
    assert again.token_id == token.pk and credential is None
    daemons.daemon_deregister(daemon=again)
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_it_revokes_the_credential_but_never_the_token_that_registered(pool):
    token, _ = token_create(username="alice", role="operator")
    daemon, _ = registration.daemon_register(
        owner=token.user, name="hand", queues=["w"], token=token
    )
    assert daemon.token_id != token.pk and daemon.token.bound
    daemons.daemon_drop(daemon=daemon)
    token.refresh_from_db()
    daemon.token.refresh_from_db()
    assert token.revoked_at is None and daemon.token.revoked_at is not None


def test_it_revokes_every_daemon_token_of_a_removed_provider(pool):
    first, one = _minted()
    second, two = _minted()
    daemons.daemon_deregister(daemon=first)  # revoked as it ended
    Daemon.objects.filter(pk=second.pk).update(state="lost")  # lost: kept so far
    fleet_services.provider_delete(name="sim")
    assert not ApiToken.objects.usable().filter(pk__in=[one.pk, two.pk]).exists()


def test_a_provider_that_fails_to_stop_a_daemon_says_so_in_the_audit_trail(pool, monkeypatch):
    def refuse(*, daemon):
        raise RuntimeError("the cloud said no")

    monkeypatch.setattr(DRIVERS["simulated"], "release", refuse)
    daemon, _ = _minted()
    daemons._release(Daemon.objects.select_related("provider").get(pk=daemon.pk))
    event = QueueEvent.objects.get()
    assert (event.action, event.queue.name) == ("terminate_failed", "w")
    assert "the cloud said no" in event.reason
