"""A daemon's reports racing their own retry and other daemons: a completion or a
failure reported again after a lost response is recorded once, another daemon's or
attempt's report is refused as claim_stale, a daemon no longer live learns why from the
code, and a failed attempt waits its back-off, doubling up to its cap, before it can be
claimed again."""

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from fleet import protocol
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from jobs.transitions import completion
from tests.support import builders

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "lakeshore.functions.echo"


# ---------------------------------------------------------------------------- completion


def test_a_completion_retried_after_a_lost_response_is_recorded_once(daemon_client):
    builders.queue(name="w")
    inv, _ = services.invocation_submit(function=ECHO, queue="w")
    me = builders.register(daemon_client, {"name": "d", "queues": ["w"]}).json()
    daemon_client.post(f"/api/v1/daemons/{me['id']}/claim/", {"limit": 1}, format="json")
    report = {"invocation": inv.pk, "attempt": 1, "state": "succeeded", "result": [1]}

    first = daemon_client.post(f"/api/v1/daemons/{me['id']}/complete/", report, format="json")
    stored = Invocation.objects.get(pk=inv.pk)
    retry = daemon_client.post(f"/api/v1/daemons/{me['id']}/complete/", report, format="json")

    assert first.status_code == retry.status_code == 200
    assert retry.json() == first.json()
    again = Invocation.objects.get(pk=inv.pk)
    assert (again.state, again.finished_at, again.result) == (
        "succeeded",
        stored.finished_at,
        [1],
    )


def test_a_retried_failure_report_is_recorded_once_even_after_its_requeue(daemon_client, settings):
    settings.LAKESHORE_RETRY_BACKOFF = 60
    builders.queue(name="w")
    inv, _ = services.invocation_submit(function=ECHO, queue="w", max_attempts=3)
    me = builders.register(daemon_client, {"name": "d", "queues": ["w"]}).json()
    daemon_client.post(f"/api/v1/daemons/{me['id']}/claim/", {"limit": 1}, format="json")
    report = {"invocation": inv.pk, "attempt": 1, "state": "failed", "error": "boom"}

    first = daemon_client.post(f"/api/v1/daemons/{me['id']}/complete/", report, format="json")
    retry = daemon_client.post(f"/api/v1/daemons/{me['id']}/complete/", report, format="json")

    assert first.status_code == retry.status_code == 200
    inv.refresh_from_db()
    assert (inv.state, inv.attempts, inv.error) == ("queued", 1, "boom")


def test_another_daemon_or_attempt_still_gets_409_claim_stale(daemon_client):
    builders.queue(name="w")
    inv, _ = services.invocation_submit(function=ECHO, queue="w")
    them = APIClient(SERVER_NAME="localhost")
    them.credentials(**builders.auth(builders.token("daemon")))
    me = builders.register(daemon_client, {"name": "d", "queues": ["w"]}).json()
    other = builders.register(them, {"name": "e", "queues": ["w"]}).json()
    daemon_client.post(f"/api/v1/daemons/{me['id']}/claim/", {"limit": 1}, format="json")
    report = {"invocation": inv.pk, "attempt": 1, "state": "succeeded", "result": 1}

    theirs = them.post(f"/api/v1/daemons/{other['id']}/complete/", report, format="json")
    wrong_attempt = daemon_client.post(
        f"/api/v1/daemons/{me['id']}/complete/", {**report, "attempt": 2}, format="json"
    )

    assert (theirs.status_code, theirs.json()["error"]["code"]) == (409, "claim_stale")
    assert (wrong_attempt.status_code, wrong_attempt.json()["error"]["code"]) == (
        409,
        "claim_stale",
    )
    assert Invocation.objects.get(pk=inv.pk).state == "running"


def test_the_daemon_learns_why_it_may_not_claim_from_the_code(daemon_client):
    builders.queue(name="w")
    me = builders.register(daemon_client, {"name": "d", "queues": ["w"]}).json()
    Daemon.objects.filter(pk=me["id"]).update(state="lost")
    lost = daemon_client.post(f"/api/v1/daemons/{me['id']}/claim/", {}, format="json")
    Daemon.objects.filter(pk=me["id"]).update(state="terminated")
    gone = daemon_client.post(f"/api/v1/daemons/{me['id']}/heartbeat/", format="json")
    assert (lost.status_code, lost.json()["error"]["code"]) == (409, "daemon_lost")
    assert (gone.status_code, gone.json()["error"]["code"]) == (409, "daemon_terminated")


# ---------------------------------------------------------------------------- back-off


def test_a_failed_attempt_waits_its_back_off_before_it_can_be_claimed_again(settings):
    settings.LAKESHORE_RETRY_BACKOFF = 20
    settings.LAKESHORE_RETRY_BACKOFF_MAX = 300
    builders.queue(name="w")
    inv, _ = services.invocation_submit(function=ECHO, queue="w", max_attempts=3)
    daemon = builders.daemon(queues=["w"])
    builders.claim(daemon=daemon)
    protocol.invocation_complete(
        daemon=daemon, invocation_id=inv.pk, attempt=1, outcome="failed", error="x"
    )
    inv.refresh_from_db()
    wait = (inv.scheduled_at - inv.created_at).total_seconds()
    assert inv.state == "queued" and 10 <= wait <= 21  # 20 s × a jitter in [0.5, 1)

    assert builders.claim(daemon=daemon) == []
    Invocation.objects.filter(pk=inv.pk).update(scheduled_at=None)  # its time has come
    assert [i.pk for i in builders.claim(daemon=daemon)] == [inv.pk]


def test_the_back_off_doubles_per_attempt_up_to_its_cap(settings):
    settings.LAKESHORE_RETRY_BACKOFF = 10
    settings.LAKESHORE_RETRY_BACKOFF_MAX = 25
    builders.queue(name="w")
    inv, _ = services.invocation_submit(function=ECHO, queue="w", max_attempts=5)
    daemon = builders.daemon(queues=["w"])
    waits = []
    for attempt in (1, 2, 3):
        Invocation.objects.filter(pk=inv.pk).update(scheduled_at=None)
        builders.claim(daemon=daemon)
        with transaction.atomic():
            completion.complete(
                daemon_id=daemon.pk,
                invocation_id=inv.pk,
                attempt=attempt,
                outcome="failed",
                result=None,
                error="x",
            )
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT extract(epoch FROM scheduled_at - now()) FROM jobs_invocation "
                    "WHERE id = %s",
                    [inv.pk],
                )
                waits.append(cursor.fetchone()[0])
    assert 5 <= waits[0] < 10  # 10 × [0.5, 1)
    assert 10 <= waits[1] < 20  # 20 × [0.5, 1)
    assert 12.5 <= waits[2] < 25  # 40, capped at 25
