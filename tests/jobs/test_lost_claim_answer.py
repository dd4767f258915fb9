"""A claim commits but its answer never reaches the daemon (a timeout, a dropped
connection): the daemon's next heartbeats say what it holds, and work it never got goes
back to the queue once the claim grace has passed, its attempt given back."""

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.daemons import CLAIM_GRACE_SECONDS
from jobs import services
from jobs.models import Invocation
from tests.support import builders

pytestmark = pytest.mark.django_db

ECHO = "lakeshore.functions.echo"


@pytest.fixture
def lost_answer(daemon_client):
    builders.queue(name="w")
    lost, _ = services.invocation_submit(function=ECHO, queue="w")
    kept, _ = services.invocation_submit(function=ECHO, queue="w")
    me = builders.register(daemon_client, {"name": "d", "queues": ["w"]}).json()
    daemon_client.post(f"/api/v1/daemons/{me['id']}/claim/", {"limit": 2}, format="json")
    return me["id"], lost, kept


def _age(*invocations, seconds):
    Invocation.objects.filter(pk__in=[i.pk for i in invocations]).update(
        started_at=timezone.now() - timedelta(seconds=seconds)
    )


def _beat(client, me, held):
    body = {} if held is None else {"held": held}
    response = client.post(f"/api/v1/daemons/{me}/heartbeat/", body, format="json")
    assert response.status_code == 200, response.json()
    return response.json()


def test_work_the_daemon_never_got_is_requeued_after_the_grace(daemon_client, lost_answer):
    me, lost, kept = lost_answer
    _age(lost, kept, seconds=CLAIM_GRACE_SECONDS + 1)

    answer = _beat(daemon_client, me, held=[kept.pk])

    lost.refresh_from_db()
    kept.refresh_from_db()
    assert (lost.state, lost.attempts, lost.daemon_id) == ("queued", 0, None)
    assert (kept.state, kept.attempts) == ("running", 1)
    assert answer["running"] == [str(kept.pk)]


def test_a_claim_younger_than_the_grace_is_left_alone(daemon_client, lost_answer):
    me, lost, kept = lost_answer  # the answer may still be on its way
    _beat(daemon_client, me, held=[kept.pk])
    lost.refresh_from_db()
    assert lost.state == "running"


def test_a_heartbeat_without_a_held_list_releases_nothing(daemon_client, lost_answer):
    me, lost, kept = lost_answer  # daemons that do not say what they hold (the SDK's)
    _age(lost, kept, seconds=CLAIM_GRACE_SECONDS + 1)
    _beat(daemon_client, me, held=None)
    assert set(Invocation.objects.values_list("state", flat=True)) == {"running"}


def test_a_bad_held_list_is_refused(daemon_client, lost_answer):
    me, _, _ = lost_answer
    response = daemon_client.post(
        f"/api/v1/daemons/{me}/heartbeat/", {"held": ["x"]}, format="json"
    )
    assert response.status_code == 400
    assert "held" in str(response.json()["error"]["fields"])
