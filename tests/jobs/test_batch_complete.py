"""Batch completion: many outcomes in one request, each fenced alone."""

import pytest

from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from tests.support import builders

pytestmark = pytest.mark.django_db

ECHO = "lakeshore.functions.echo"


@pytest.fixture
def claimed(daemon_client):
    builders.queue(name="w")
    ids = [services.invocation_submit(function=ECHO, queue="w")[0].pk for _ in range(3)]
    me = builders.register(daemon_client, {"name": "d", "queues": ["w"]}).json()
    got = daemon_client.post(f"/api/v1/daemons/{me['id']}/claim/", {"limit": 3}, format="json")
    assert [int(i["id"]) for i in got.json()] == ids
    return me["id"], ids


def _report(ids, attempt=1):
    return [
        {"invocation": pk, "attempt": attempt, "state": "succeeded", "result": pk} for pk in ids
    ]


def test_one_stale_outcome_in_a_batch_is_refused_alone(daemon_client, claimed):
    me, ids = claimed
    outcomes = _report(ids)
    outcomes[1]["attempt"] = 2  # not the attempt this daemon holds

    response = daemon_client.post(f"/api/v1/daemons/{me}/complete/", outcomes, format="json")

    assert response.status_code == 200
    body = response.json()
    assert [item["ok"] for item in body] == [True, False, True]
    assert body[1]["invocation"] == str(ids[1])
    assert body[1]["error"]["code"] == "claim_stale"
    states = dict(Invocation.objects.values_list("id", "state"))
    assert [states[pk] for pk in ids] == ["succeeded", "running", "succeeded"]


def test_a_batch_retried_after_a_lost_response_is_recorded_once(daemon_client, claimed):
    me, ids = claimed
    first = daemon_client.post(f"/api/v1/daemons/{me}/complete/", _report(ids), format="json")
    finished = dict(Invocation.objects.values_list("id", "finished_at"))
    again = daemon_client.post(f"/api/v1/daemons/{me}/complete/", _report(ids), format="json")
    assert first.json() == again.json()
    assert all(item["ok"] and item["state"] == "succeeded" for item in again.json())
    assert dict(Invocation.objects.values_list("id", "finished_at")) == finished


def test_a_daemon_that_is_no_longer_live_gets_409_for_the_whole_batch(daemon_client, claimed):
    me, ids = claimed
    Daemon.objects.filter(pk=me).update(state="terminated")
    response = daemon_client.post(f"/api/v1/daemons/{me}/complete/", _report(ids), format="json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "daemon_terminated"
    assert set(Invocation.objects.values_list("state", flat=True)) == {"running"}


@pytest.mark.parametrize("size", [0, 1001])
def test_a_batch_holds_1_to_1000_outcomes(daemon_client, claimed, size):
    me, ids = claimed
    outcomes = (_report(ids) * 400)[:size]
    response = daemon_client.post(f"/api/v1/daemons/{me}/complete/", outcomes, format="json")
    assert response.status_code == 400
    assert "1 to 1000" in response.json()["error"]["message"]


def test_a_bad_item_names_its_place(daemon_client, claimed):
    me, ids = claimed
    outcomes = _report(ids)
    outcomes[2]["state"] = "exploded"
    response = daemon_client.post(f"/api/v1/daemons/{me}/complete/", outcomes, format="json")
    assert response.status_code == 400
    assert "2.state" in response.json()["error"]["fields"]
    assert set(Invocation.objects.values_list("state", flat=True)) == {"running"}


def test_it_costs_the_same_queries_per_outcome(
    daemon_client, claimed, django_assert_max_num_queries
):
    me, ids = claimed
    with django_assert_max_num_queries(6 + 2 * len(ids) + 4):
        daemon_client.post(f"/api/v1/daemons/{me}/complete/", _report(ids), format="json")


def test_a_retried_batch_of_a_daemon_gone_meanwhile_still_answers_what_was_recorded(
    daemon_client, claimed
):
    me, ids = claimed
    daemon_client.post(f"/api/v1/daemons/{me}/complete/", _report(ids[:2]), format="json")
    Daemon.objects.filter(pk=me).update(state="lost")  # then its answer was lost, and it

    again = daemon_client.post(f"/api/v1/daemons/{me}/complete/", _report(ids), format="json")

    assert again.status_code == 200
    body = again.json()
    assert [item["ok"] for item in body] == [True, True, False]
    assert body[2]["error"]["code"] == "daemon_lost"
    assert Invocation.objects.get(pk=ids[2]).state == "running"  # nothing new recorded


def test_a_refused_item_says_the_state_it_found(daemon_client, claimed):
    me, ids = claimed
    Invocation.objects.filter(pk=ids[0]).update(state="killed")
    body = daemon_client.post(
        f"/api/v1/daemons/{me}/complete/", _report(ids[:1]), format="json"
    ).json()
    assert body[0]["error"] == {
        "code": "claim_stale",
        "message": body[0]["error"]["message"],
        "state": "killed",
        "reason": "",  # who killed it: nobody said (the row was set killed by hand)
    }
