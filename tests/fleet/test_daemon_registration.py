"""One credential makes many daemons (issue 29, item 8). A daemon's own credential
registers no other daemon, by any route: the REST register, an SDK worker's first poll
with a new worker id, a lost worker's return. A token that registers daemons holds at
most LAKESHORE_DAEMONS_PER_TOKEN live ones (429 daemons_per_token), and admits again
once one ends. fleet/registration.admit_registration decides for every route.

The controls: a bootstrap token's poll registers; with the rule switched off the
credential's poll makes rows, as it did; under the limit, registrations pass.
tests/accounts/test_principals_server.py repeats the first attack through make run's
server."""

import threading
import time
from datetime import timedelta

import msgpack
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.services import token_create
from fleet import daemons, registration, services
from fleet.api.serializers import RegisteredDaemonSerializer
from fleet.models import Daemon
from lakeshore_admin import hooks
from lakeshore_admin.errors import QuotaReached
from tests.support import builders
from tests.support.sdk_wire import answer_of

pytestmark = [pytest.mark.django_db, pytest.mark.security]

REGISTER = "/api/v1/daemons/register/"


def poll(api, raw: str, worker_id: str, queue: str = "w") -> tuple[int, dict]:
    body = msgpack.packb(
        {"worker_id": worker_id, "queue": queue, "timeout_s": 0}, use_bin_type=True
    )
    api.credentials(**builders.auth(raw))
    answer = api.post("/v1/daemon/poll", data=body, content_type="application/x-msgpack")
    return answer.status_code, answer_of(answer)


def register(api, raw: str, name: str, queue: str = "w"):
    api.credentials(**builders.auth(raw))
    return api.post(REGISTER, {"name": name, "queues": [queue]}, format="json")


@pytest.fixture
def daemon_one(api):
    """Daemon 1, registered with a bootstrap daemon token: (bootstrap raw, its row,
    its own credential raw)."""
    builders.queue(name="w")
    _, bootstrap = token_create(username="robots", role="daemon")
    answer = register(api, bootstrap, "one")
    assert answer.status_code == 201, answer.json()
    return bootstrap, Daemon.objects.get(pk=answer.json()["id"]), answer.json()["token"]


def _code(status_and_answer) -> tuple[int, str]:
    status, answer = status_and_answer
    return status, answer.get("error", {}).get("code", "")


def test_a_daemons_credential_polls_no_new_worker_into_being(api, daemon_one):
    _, one, credential = daemon_one
    for worker in ("host-a", "host-b", "host-c"):
        assert _code(poll(api, credential, worker)) == (403, "not_your_daemon")
    assert list(Daemon.objects.values_list("pk", flat=True)) == [one.pk]


def test_control_a_bootstrap_tokens_poll_registers_a_worker(api, daemon_one):
    bootstrap, one, _ = daemon_one
    assert poll(api, bootstrap, "host-a") == (200, {"commands": []})
    worker = Daemon.objects.get(worker_id="host-a")
    assert (worker.registered_with_id, worker.state) == (one.registered_with_id, "idle")


def test_control_with_the_rule_switched_off_the_credential_makes_daemons(
    api, daemon_one, monkeypatch
):
    """What the server did before: no check on a bound credential's first poll."""
    _, _, credential = daemon_one
    monkeypatch.setattr(registration, "admit_registration", lambda *, token, returning=None: None)
    for worker in ("host-a", "host-b", "host-c"):
        assert poll(api, credential, worker)[0] == 200
    assert Daemon.objects.filter(worker_id__isnull=False).count() == 3


def test_a_daemons_credential_registers_no_other_daemon_by_rest(api, daemon_one):
    _, one, credential = daemon_one
    answer = register(api, credential, "two")
    assert (answer.status_code, answer.json()["error"]["code"]) == (403, "not_your_daemon")
    assert list(Daemon.objects.values_list("pk", flat=True)) == [one.pk]


def _lose(daemon_pk: int) -> None:
    """The reaper's verdict on a daemon silent past the heartbeat timeout."""
    silent = timezone.now() - timedelta(days=1)
    Daemon.objects.filter(pk=daemon_pk).update(last_heartbeat_at=silent)
    assert daemon_pk in daemons.daemons_mark_lost()


def test_a_token_holds_at_most_its_limit_of_live_daemons_by_rest(api, daemon_one, settings):
    settings.LAKESHORE_DAEMONS_PER_TOKEN = 2
    bootstrap, one, credential = daemon_one
    assert register(api, bootstrap, "two").status_code == 201  # control: under the limit
    refused = register(api, bootstrap, "three")
    assert (refused.status_code, refused.json()["error"]["code"]) == (429, "daemons_per_token")
    assert Daemon.objects.count() == 2
    api.credentials(**builders.auth(credential))  # daemon one leaves: room for one more
    assert api.post(f"/api/v1/daemons/{one.pk}/deregister/", {}, format="json").status_code == 200
    assert register(api, bootstrap, "three").status_code == 201
    assert Daemon.objects.live().count() == 2


def test_a_lost_daemons_return_counts_against_the_token_that_registered_it(
    api, daemon_one, settings
):
    settings.LAKESHORE_DAEMONS_PER_TOKEN = 1
    bootstrap, one, credential = daemon_one
    _lose(one.pk)
    assert register(api, bootstrap, "two").status_code == 201  # one is lost: room for two
    back = register(api, credential, "one")  # one's credential registers it again
    assert (back.status_code, back.json()["error"]["code"]) == (429, "daemons_per_token")
    settings.LAKESHORE_DAEMONS_PER_TOKEN = 2  # control: with room, it comes back
    assert register(api, credential, "one").status_code == 201
    assert Daemon.objects.live().count() == 2


def test_sdk_workers_polling_with_one_token_are_bounded_and_admitted_again(api, settings):
    settings.LAKESHORE_DAEMONS_PER_TOKEN = 2
    builders.queue(name="w")
    _, raw = token_create(username="pool", role="daemon")
    assert poll(api, raw, "host-a")[0] == 200
    assert poll(api, raw, "host-b")[0] == 200
    assert _code(poll(api, raw, "host-c")) == (429, "daemons_per_token")
    assert not Daemon.objects.filter(worker_id="host-c").exists()
    _lose(Daemon.objects.get(worker_id="host-a").pk)  # a lost worker ends its share
    assert poll(api, raw, "host-c")[0] == 200
    # the lost worker's return is a registration too: no room now
    assert _code(poll(api, raw, "host-a")) == (429, "daemons_per_token")
    assert Daemon.objects.get(worker_id="host-a").state == "lost"
    settings.LAKESHORE_DAEMONS_PER_TOKEN = 3  # control: with room, it comes back
    assert poll(api, raw, "host-a")[0] == 200
    assert Daemon.objects.get(worker_id="host-a").state == "idle"


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


def _registrations_at_once(settings) -> tuple[int, list]:
    """Two first polls with one token, limit 1 (near it: counted one at a time), the
    second while the first has counted (_second_during_the_first): the live workers
    after both, and the second's answer (its daemon's id, or the refusal's code)."""
    seen = _second_during_the_first(settings, limit=1)
    return seen["live"], [seen["second"]]


@pytest.mark.django_db(transaction=True)
def test_two_registrations_at_once_count_each_other(settings):
    live, second = _registrations_at_once(settings)
    assert (live, second) == (1, ["daemons_per_token"])


@pytest.mark.django_db(transaction=True)
def test_control_without_the_tokens_lock_both_pass_the_count(monkeypatch, settings):
    monkeypatch.setattr(registration, "lock_registrar", lambda token_id: None)
    live, second = _registrations_at_once(settings)
    assert live == 2 and isinstance(second[0], int)


def _second_during_the_first(settings, limit: int, *, others: int = 0) -> dict:
    """Two first polls with one token: the second comes while the first has counted and
    not yet made its row (the hook point), after `others` more live daemons of the
    token were committed meanwhile (another thread's, as registrations finishing in
    between would leave). Answers whether the second waited on a lock, its answer (a
    daemon id or the refusal's code), and the live workers after both."""
    settings.LAKESHORE_DAEMONS_PER_TOKEN = limit
    builders.queue(name="w")
    token, _ = token_create(username="pool", role="daemon")
    seen: dict = {"waited": False, "second": None}

    def add_others():
        for n in range(others):
            builders.daemon(queues=["w"], registered_with=token, name=f"other-{n}")
        connection.close()

    def second_poll():
        try:
            made = registration.sdk_worker_seen(
                owner=token.user, worker_id="host-b", queue="w", token=token
            )
            seen["second"] = made.pk
        except QuotaReached as refused:
            seen["second"] = refused.code
        finally:
            connection.close()

    def the_second_comes_now():
        hooks.clear("registration.counted")
        adding = threading.Thread(target=add_others)
        adding.start()
        adding.join(30)
        thread = threading.Thread(target=second_poll)
        thread.start()
        seen["thread"] = thread
        for _ in range(3000):  # until it is done, or waits for the first to commit
            if not thread.is_alive():
                return
            if _waiting_on_a_lock():
                seen["waited"] = True
                return
            time.sleep(0.01)

    hooks.register("registration.counted", the_second_comes_now)
    try:
        registration.sdk_worker_seen(owner=token.user, worker_id="host-a", queue="w", token=token)
    finally:
        hooks.clear()
    seen["thread"].join(30)
    return {**seen, "live": Daemon.objects.live().count()}


@pytest.mark.django_db(transaction=True)
def test_registrations_far_from_the_limit_do_not_wait_for_each_other(settings):
    """A fleet coming up registers hundreds a second with one bootstrap token: each one
    counted alone made them queue behind each other's commit (the idle-fleet bench's
    registrations timed out at 2,000 daemons). Far from the limit they share the row."""
    seen = _second_during_the_first(settings, limit=1000)
    assert (seen["waited"], isinstance(seen["second"], int), seen["live"]) == (False, True, 2)


@pytest.mark.django_db(transaction=True)
def test_control_counted_one_at_a_time_the_second_waits(monkeypatch, settings):
    monkeypatch.setattr(registration, "share_registrar", registration.lock_registrar)
    seen = _second_during_the_first(settings, limit=1000)
    assert (seen["waited"], isinstance(seen["second"], int), seen["live"]) == (True, True, 2)


@pytest.mark.django_db(transaction=True)
def test_near_the_limit_a_registration_waits_for_those_under_way(monkeypatch, settings):
    """The first counted 0 with room for every registration the database can hold at
    once (here 2), so it goes on without a turn of its own; another daemon of the token
    commits meanwhile; the second counts 1, near the limit of 2, and waits for the first
    to commit: it then counts 2 and is refused. The limit holds."""
    monkeypatch.setattr(registration, "in_flight_bound", lambda: 2)
    seen = _second_during_the_first(settings, limit=2, others=1)
    assert (seen["waited"], seen["second"], seen["live"]) == (True, "daemons_per_token", 2)


@pytest.mark.django_db(transaction=True)
def test_control_if_those_far_from_it_held_nothing_the_limit_is_passed(monkeypatch, settings):
    monkeypatch.setattr(registration, "in_flight_bound", lambda: 2)
    monkeypatch.setattr(registration, "share_registrar", lambda token_id: None)
    seen = _second_during_the_first(settings, limit=2, others=1)
    assert (seen["waited"], isinstance(seen["second"], int), seen["live"]) == (False, True, 3)


def test_a_registration_takes_its_statements_and_answers_the_daemon_as_stored(api):
    """A new daemon is answered as it was made, not read again: the answer is what a
    read of its row gives. The statements: the queues, the token's row in share and its
    count (in a savepoint), the credential, the daemon, and the transaction's own."""
    builders.queue(name="w")
    _, bootstrap = token_create(username="robots", role="daemon")
    register(api, bootstrap, "warm")  # the first request of a test reads what it caches
    with CaptureQueriesContext(connection) as ran:
        answer = register(api, bootstrap, "counted")
    assert answer.status_code == 201, answer.json()
    statements = [q["sql"].split()[0].upper() for q in ran.captured_queries]
    assert len(statements) == REGISTRATION_STATEMENTS, statements
    assert not [s for s in statements if s == "UPDATE"]  # the credential is set as it is made
    stored = services.daemon_get(answer.json()["id"])
    stored.credential = answer.json()["token"]
    assert answer.json() == RegisteredDaemonSerializer(stored).data


# The token and its groups, the queues, a savepoint for the request's transaction (the
# test's own holds it) and one for the count, the token's row and the count, the
# credential and the daemon: 11 (13 when the daemon took its credential in an UPDATE
# and the answer read it again)
REGISTRATION_STATEMENTS = 11
