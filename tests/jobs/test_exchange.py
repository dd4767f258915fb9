"""Exchange: a daemon reports outcomes and claims more work in one request. It is the
batch completion then the claim, each with its own rules: outcomes fenced alone, a gone
daemon claims nothing, outcomes recorded before a failed claim stay recorded."""

import threading

import pytest
from django.db import OperationalError, connection
from rest_framework.test import APIClient

from fleet import daemons
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from lakeshore_admin import hooks
from lakeshore_admin.errors import Conflict
from tests.support import builders

pytestmark = pytest.mark.django_db

ECHO = "lakeshore.functions.echo"


@pytest.fixture(autouse=True)
def _no_hooks_left():
    yield
    hooks.clear()


@pytest.fixture
def world(daemon_client):
    """A daemon (registered through the API) holding 3 claimed invocations of queue w,
    and 2 more queued there."""
    builders.queue(name="w")
    ids = [services.invocation_submit(function=ECHO, queue="w")[0].pk for _ in range(5)]
    me = builders.register(daemon_client, {"name": "d", "queues": ["w"]}).json()["id"]
    got = daemon_client.post(f"/api/v1/daemons/{me}/claim/", {"limit": 3}, format="json")
    assert [int(i["id"]) for i in got.json()] == ids[:3]
    return me, ids[:3], ids[3:]


def _report(ids, attempt=1):
    return [
        {"invocation": pk, "attempt": attempt, "state": "succeeded", "result": pk} for pk in ids
    ]


def _exchange(client, me, **body):
    return client.post(f"/api/v1/daemons/{me}/exchange/", body, format="json")


def _states(ids):
    states = dict(Invocation.objects.filter(pk__in=ids).values_list("id", "state"))
    return [states[pk] for pk in ids]


# ---------------------------------------------------------------------------- the service


def test_the_service_records_then_claims(world):
    me, held, queued = world
    daemon = Daemon.objects.get(pk=me)

    answer = builders.exchange(daemon=daemon, outcomes=_report(held), limit=1)

    assert [a["ok"] for a in answer["recorded"]] == [True, True, True]
    assert [a["invocation"] for a in answer["recorded"]] == [str(pk) for pk in held]
    assert [inv.pk for inv in answer["claimed"]] == queued[:1]
    assert _states(held + queued) == ["succeeded"] * 3 + ["running", "queued"]


def test_without_outcomes_it_is_a_claim(world):
    me, held, queued = world
    answer = builders.exchange(daemon=Daemon.objects.get(pk=me), outcomes=[], limit=5)
    assert answer["recorded"] == []
    assert [inv.pk for inv in answer["claimed"]] == queued


def test_limit_0_records_and_claims_nothing(world):
    me, held, queued = world
    answer = builders.exchange(
        daemon=Daemon.objects.get(pk=me), outcomes=_report(held[:1]), limit=0
    )
    assert [a["ok"] for a in answer["recorded"]] == [True]
    assert answer["claimed"] == []
    assert _states(held[:1] + queued) == ["succeeded", "queued", "queued"]


def test_a_gone_daemon_without_outcomes_gets_the_claims_conflict(world):
    me, held, queued = world
    Daemon.objects.filter(pk=me).update(state="terminated")
    with pytest.raises(Conflict) as gone:
        builders.exchange(daemon=Daemon.objects.get(pk=me), outcomes=[], limit=1)
    assert gone.value.code == "daemon_terminated"
    assert _states(queued) == ["queued", "queued"]


# ---------------------------------------------------------------------------- the API


def test_one_stale_outcome_is_refused_alone_and_the_claim_still_happens(daemon_client, world):
    me, held, queued = world
    outcomes = _report(held)
    outcomes[1]["attempt"] = 2  # not the attempt this daemon holds

    response = _exchange(daemon_client, me, outcomes=outcomes, limit=2)

    assert response.status_code == 200, response.json()
    body = response.json()
    assert [item["ok"] for item in body["recorded"]] == [True, False, True]
    assert body["recorded"][1]["error"]["code"] == "claim_stale"
    assert body["recorded"][1]["invocation"] == str(held[1])
    assert [int(inv["id"]) for inv in body["claimed"]] == queued
    assert all(inv["state"] == "running" and inv["worker"] == me for inv in body["claimed"])
    assert _states(held + queued) == ["succeeded", "running", "succeeded", "running", "running"]


def test_it_answers_what_complete_and_claim_answer(daemon_client, operator, world):
    """The same items and answers as a batch completion, the same invocations as a
    claim: a composition of the two, not a protocol of its own."""
    me, held, queued = world
    body = _exchange(daemon_client, me, outcomes=_report(held[:2]), limit=1).json()
    batch = daemon_client.post(
        f"/api/v1/daemons/{me}/complete/", _report(held[:2]), format="json"
    ).json()  # a retry: the stored answers
    assert body["recorded"] == batch
    shown = set(operator.get(f"/api/v1/jobs/{queued[0]}/").json())
    detail_only = {"position", "retried_as", "discarded_outcome", "discarded_at"}
    assert set(body["claimed"][0]) == shown - detail_only | {"args_blob"}  # claim


def test_a_gone_daemon_gets_409_records_nothing_and_claims_nothing(daemon_client, world):
    me, held, queued = world
    Daemon.objects.filter(pk=me).update(state="lost")

    response = _exchange(daemon_client, me, outcomes=_report(held), limit=2)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "daemon_lost"
    assert _states(held + queued) == ["running"] * 3 + ["queued"] * 2


def test_a_gone_daemons_retry_answers_what_was_recorded_and_claims_nothing(daemon_client, world):
    me, held, queued = world
    _exchange(daemon_client, me, outcomes=_report(held[:2]), limit=0)  # its answer was lost
    Daemon.objects.filter(pk=me).update(state="terminated")

    again = _exchange(daemon_client, me, outcomes=_report(held), limit=2)

    assert again.status_code == 200, again.json()
    body = again.json()
    assert [item["ok"] for item in body["recorded"]] == [True, True, False]
    assert body["recorded"][2]["error"]["code"] == "daemon_terminated"
    assert body["claimed"] == []
    assert _states(held + queued) == ["succeeded", "succeeded", "running", "queued", "queued"]


def test_limit_0_only_records(daemon_client, world):
    me, held, queued = world
    body = _exchange(daemon_client, me, outcomes=_report(held), limit=0).json()
    assert [item["ok"] for item in body["recorded"]] == [True, True, True]
    assert body["claimed"] == []
    assert _states(queued) == ["queued", "queued"]


def test_no_outcomes_is_a_claim_and_a_gone_daemon_gets_409(daemon_client, world):
    me, held, queued = world
    body = _exchange(daemon_client, me, limit=1).json()
    assert body["recorded"] == []
    assert [int(inv["id"]) for inv in body["claimed"]] == queued[:1]

    Daemon.objects.filter(pk=me).update(state="terminated")
    response = _exchange(daemon_client, me, outcomes=[], limit=1)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "daemon_terminated"


def test_a_retry_after_a_lost_answer_gets_the_recorded_answers_once(daemon_client, world):
    me, held, queued = world
    first = _exchange(daemon_client, me, outcomes=_report(held), limit=1).json()
    finished = dict(Invocation.objects.filter(pk__in=held).values_list("id", "finished_at"))

    again = _exchange(daemon_client, me, outcomes=_report(held), limit=1).json()

    assert again["recorded"] == first["recorded"]
    assert all(item["ok"] and item["state"] == "succeeded" for item in again["recorded"])
    finished_again = Invocation.objects.filter(pk__in=held).values_list("id", "finished_at")
    assert dict(finished_again) == finished  # recorded once
    # the lost answer's claim is the heartbeat's business (held ids); the retry claims anew
    assert [int(i["id"]) for i in first["claimed"] + again["claimed"]] == queued


@pytest.mark.django_db(transaction=True)
def test_outcomes_recorded_before_a_failed_claim_stay_recorded_and_a_retry_answers_them(
    daemon_client, world
):
    me, held, queued = world

    def database_gone():
        raise OperationalError("the database went away")

    hooks.register("claim.before_statement", database_gone)
    failed = _exchange(daemon_client, me, outcomes=_report(held[:2]), limit=2)

    assert failed.status_code == 503
    assert failed.json()["error"]["code"] == "unavailable"
    assert _states(held + queued) == ["succeeded", "succeeded", "running", "queued", "queued"]

    hooks.clear()
    again = _exchange(daemon_client, me, outcomes=_report(held[:2]), limit=2)

    assert again.status_code == 200, again.json()
    body = again.json()
    assert [(item["ok"], item["state"]) for item in body["recorded"]] == [
        (True, "succeeded"),
        (True, "succeeded"),
    ]
    assert [int(inv["id"]) for inv in body["claimed"]] == queued


@pytest.mark.django_db(transaction=True)
def test_a_drop_between_the_outcomes_and_the_claim_keeps_the_outcomes_and_takes_nothing(world):
    me, held, queued = world

    def drop_meanwhile():
        def drop():
            try:
                daemons.daemon_drop(daemon=Daemon.objects.get(pk=me))
            finally:
                connection.close()

        dropper = threading.Thread(target=drop)
        dropper.start()
        dropper.join(30)

    hooks.register("claim.before_statement", drop_meanwhile)

    answer = builders.exchange(
        daemon=Daemon.objects.get(pk=me), outcomes=_report(held[:1]), limit=2
    )

    assert [a["ok"] for a in answer["recorded"]] == [True]
    assert answer["claimed"] == []  # the claim statement looks at the daemon itself
    assert _states(held[:1] + queued) == ["succeeded", "queued", "queued"]
    assert Daemon.objects.get(pk=me).state == "terminated"


def test_a_failed_outcome_with_attempts_left_is_requeued_and_can_be_claimed_back(
    daemon_client, world
):
    me, held, queued = world
    Invocation.objects.filter(pk=held[0]).update(max_attempts=2)
    Invocation.objects.exclude(pk=held[0]).filter(state="queued").update(state="killed")
    outcome = {"invocation": held[0], "attempt": 1, "state": "failed", "error": "boom"}

    body = _exchange(daemon_client, me, outcomes=[outcome], limit=1).json()

    assert body["recorded"][0]["ok"] and body["recorded"][0]["state"] == "queued"
    assert body["claimed"] == []  # its back-off has not ended: not claimable yet
    assert Invocation.objects.get(pk=held[0]).state == "queued"


def test_a_token_acts_only_for_its_own_daemon(world):
    me, held, queued = world
    other = APIClient(SERVER_NAME="localhost")
    other.credentials(**builders.auth(builders.token("daemon")))
    response = _exchange(other, me, outcomes=_report(held), limit=1)
    assert response.status_code == 403
    assert _states(held + queued) == ["running"] * 3 + ["queued"] * 2


def test_a_viewer_may_not_exchange(world):
    me, held, queued = world
    viewer = APIClient(SERVER_NAME="localhost")
    viewer.credentials(**builders.auth(builders.token("viewer")))
    assert _exchange(viewer, me, limit=1).status_code == 403


def test_an_unknown_daemon_is_404(operator, daemon_client, world):
    response = _exchange(operator, 999_999, limit=1)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    # a daemon token speaks for no other daemon, whether it exists or not (issue 29)
    response = _exchange(daemon_client, 999_999, limit=1)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "not_your_daemon"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"limit": 101}, "limit"),
        ({"limit": -1}, "limit"),
        ({"wait": 51}, "wait"),  # past fleet/parked.CLAIM_WAIT_MAX
        ({"outcomes": {"invocation": 1}}, "outcomes"),
        ({"lmit": 1}, "lmit"),
    ],
)
def test_bad_input_is_400_naming_the_field(daemon_client, world, body, field):
    me, held, queued = world
    response = _exchange(daemon_client, me, **body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert field in response.json()["error"]["fields"]
    assert _states(held + queued) == ["running"] * 3 + ["queued"] * 2


def test_a_bad_outcome_names_its_place_and_nothing_happens(daemon_client, world):
    me, held, queued = world
    outcomes = _report(held)
    outcomes[2]["state"] = "exploded"
    response = _exchange(daemon_client, me, outcomes=outcomes, limit=2)
    assert response.status_code == 400
    assert "outcomes.2.state" in response.json()["error"]["fields"]
    assert _states(held + queued) == ["running"] * 3 + ["queued"] * 2


def test_it_takes_at_most_1000_outcomes(daemon_client, world):
    me, held, queued = world
    response = _exchange(daemon_client, me, outcomes=(_report(held) * 334)[:1001], limit=1)
    assert response.status_code == 400
    assert "outcomes" in response.json()["error"]["fields"]
    assert "1000" in response.json()["error"]["message"]
    assert _states(held + queued) == ["running"] * 3 + ["queued"] * 2


def test_one_outcome_and_a_claim_of_one_cost_a_bounded_number_of_queries(
    daemon_client, world, django_assert_max_num_queries
):
    me, held, queued = world
    _exchange(daemon_client, me, limit=0)  # warm: the queue rows' cache
    # the token and its roles (2), the daemon (1); the batch: its UPDATE; the claim: its
    # statement, which marks a daemon busy itself (busy already here: no write); each
    # transaction a savepoint pair here (4: under a test's transaction; BEGIN/COMMIT, not
    # statements, when served)
    with django_assert_max_num_queries(9):
        response = _exchange(daemon_client, me, outcomes=_report(held[:1]), limit=1)
    assert response.status_code == 200
    assert [item["ok"] for item in response.json()["recorded"]] == [True]
    assert len(response.json()["claimed"]) == 1


def _busy(me):
    return Daemon.objects.for_list().values_list("state", "current_invocation_id").get(pk=me)


def test_the_daemon_is_busy_with_what_it_claimed_and_idle_when_the_claim_finds_nothing(
    daemon_client, world
):
    # the batch writes no busy/idle; the claim that follows must still come out right
    me, held, queued = world
    answer = _exchange(daemon_client, me, outcomes=_report(held), limit=1).json()
    assert [int(i["id"]) for i in answer["claimed"]] == queued[:1]
    assert _busy(me) == ("busy", queued[0])

    answer = _exchange(daemon_client, me, outcomes=_report(queued[:1]), limit=1).json()
    assert _busy(me) == ("busy", queued[1])

    answer = _exchange(daemon_client, me, outcomes=_report(queued[1:]), limit=1).json()
    assert answer["claimed"] == []
    assert _busy(me) == ("idle", None)


def test_outcomes_alone_make_the_daemon_idle_once_nothing_is_queued_for_it(daemon_client, world):
    me, held, queued = world
    _exchange(daemon_client, me, outcomes=_report(held), limit=0)
    assert _busy(me) == ("busy", None)  # work is queued: its next claim follows at once
    _exchange(daemon_client, me, outcomes=[], limit=len(queued))
    _exchange(daemon_client, me, outcomes=_report(queued), limit=0)
    assert _busy(me) == ("idle", None)  # nothing left for it: idle now


def test_a_heartbeat_makes_a_daemon_that_runs_nothing_idle(daemon_client, world):
    me, held, queued = world
    _exchange(daemon_client, me, outcomes=_report(held), limit=0)
    response = daemon_client.post(f"/api/v1/daemons/{me}/heartbeat/", {}, format="json")
    assert response.json()["state"] == "idle"
    assert _busy(me) == ("idle", None)


def test_a_draining_daemons_exchange_records_and_goes_idle(daemon_client, world):
    me, held, queued = world
    Daemon.objects.filter(pk=me).update(state="draining")
    answer = _exchange(daemon_client, me, outcomes=_report(held), limit=1).json()
    assert [a["ok"] for a in answer["recorded"]] == [True] * 3
    assert answer["claimed"] == []
    assert _busy(me) == ("draining", None)


def test_it_is_in_the_openapi_document(operator):
    schema = operator.get("/api/schema/", {"format": "json"}).json()
    operation = schema["paths"]["/api/v1/daemons/{daemon_id}/exchange/"]["post"]
    assert {"200", "400", "404", "409"} <= set(operation["responses"])
