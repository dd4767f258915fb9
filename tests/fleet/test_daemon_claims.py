"""Issue 29, item 14: what a daemon's token may claim about itself, and learn of others.

- Only the credential a provider minted for the daemon it launched may register as that
  provider's daemon; a self-registered daemon posing as provider-run would hold up the
  provider's removal (provider_in_use) and count among its daemons.
- A completion for an invocation the caller does not hold (another daemon's, another
  attempt, or none such) answers 409 claim_stale and says nothing of that invocation:
  not its state, not its attempts, not whether it exists."""

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from fleet import services as fleet_services
from fleet.driver_base import mint_daemons
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = [pytest.mark.django_db, pytest.mark.security]

ECHO = "lakeshore.functions.echo"
REGISTER = "/api/v1/daemons/register/"


def _client(raw: str) -> APIClient:
    client = APIClient(SERVER_NAME="localhost")
    client.credentials(**builders.auth(raw))
    return client


def test_a_self_registered_daemon_may_not_pose_as_provider_run():
    builders.provider(name="hpc")
    builders.queue(name="train")
    bootstrap = _client(builders.token("daemon"))

    posing = bootstrap.post(
        REGISTER, {"name": "fake", "queues": ["train"], "provider": "hpc"}, format="json"
    )
    operator = _client(builders.token("operator")).post(
        REGISTER, {"name": "fake", "queues": ["train"], "provider": "hpc"}, format="json"
    )

    assert_error(posing, 403, "provider_not_yours", field="provider")
    assert_error(operator, 403, "provider_not_yours", field="provider")
    assert not Daemon.objects.exists()
    fleet_services.provider_delete(name="hpc")  # no daemon of its own holds it up
    # Control: without a provider, the same token registers.
    plain = bootstrap.post(REGISTER, {"name": "plain", "queues": ["train"]}, format="json")
    assert plain.status_code == 201 and plain.json()["provider"] is None


def test_a_providers_own_launch_credential_registers_as_its_daemon():
    provider = builders.provider(name="hpc")
    other = builders.provider(name="other")
    queue = builders.queue(name="train", provider="hpc")
    [(launched, raw)] = mint_daemons(
        provider=provider, queue=queue, count=1, now=timezone.now(), kind="slurm"
    )
    own = _client(raw)

    elsewhere = own.post(
        REGISTER, {"name": launched.name, "queues": ["train"], "provider": other.name},
        format="json",
    )  # fmt: skip
    mine = own.post(
        REGISTER, {"name": launched.name, "queues": ["train"], "provider": "hpc"}, format="json"
    )

    assert_error(elsewhere, 403, "provider_not_yours", field="provider")
    assert mine.status_code == 201, mine.content
    assert mine.json()["provider"] == "hpc" and mine.json()["id"] == str(launched.pk)


@pytest.fixture
def held():
    """Daemon A holds invocation `mine`; daemon B, on the same queue, holds another."""
    builders.queue(name="w")
    mine, _ = services.invocation_submit(function=ECHO, queue="w")
    theirs, _ = services.invocation_submit(function=ECHO, queue="w")
    a, b = _client(builders.token("daemon")), _client(builders.token("daemon"))
    me = builders.register(a, {"name": "a", "queues": ["w"]}).json()["id"]
    other = builders.register(b, {"name": "b", "queues": ["w"]}).json()["id"]
    assert a.post(f"/api/v1/daemons/{me}/claim/", {"limit": 1}, format="json").json()
    assert b.post(f"/api/v1/daemons/{other}/claim/", {"limit": 1}, format="json").json()
    return {"a": (a, me, mine.pk), "b": (b, other, theirs.pk)}


def _complete(client, daemon, invocation, attempt=1):
    body = {"invocation": invocation, "attempt": attempt, "state": "succeeded", "result": 1}
    return client.post(f"/api/v1/daemons/{daemon}/complete/", body, format="json")


def test_a_stale_completion_says_nothing_of_an_invocation_the_caller_does_not_hold(held):
    a, me, mine = held["a"]
    _, _, theirs = held["b"]
    Invocation.objects.filter(pk=theirs).update(state="killed")  # something to leak

    answers = {
        "theirs": _complete(a, me, theirs),
        "another attempt": _complete(a, me, mine, attempt=7),
        "none such": _complete(a, me, 2**62),
    }

    for what, answer in answers.items():
        error = assert_error(answer, 409, "claim_stale")
        assert set(error) == {"code", "message", "fields"}, (what, error)  # no state
        assert "killed" not in error["message"] and "running" not in error["message"], what
    said = {answer.json()["error"]["message"] for answer in answers.values()}
    assert said == {  # one answer, whether it is another's, another attempt, or none
        f"Invocation {theirs} attempt 1 is not yours to complete; the outcome was not recorded.",
        f"Invocation {mine} attempt 7 is not yours to complete; the outcome was not recorded.",
        f"Invocation {2**62} attempt 1 is not yours to complete; the outcome was not recorded.",
    }
    assert Invocation.objects.get(pk=mine).state == "running"


def test_control_the_caller_learns_the_state_of_its_own_attempt_taken_away(held):
    a, me, mine = held["a"]
    Invocation.objects.filter(pk=mine).update(state="killed")

    error = assert_error(_complete(a, me, mine), 409, "claim_stale", says="killed")

    assert error["state"] == "killed"  # its own claim: it may know why it lost it
