"""Issue 29, item 5, for the waits that sleep in a thread (the threaded WSGI server, or
the full stack past the parked bound): one principal holds at most
LAKESHORE_MAX_WAITS_PER_PRINCIPAL of a process's LAKESHORE_MAX_WAITS. Here a live
server admits 4 waits, 2 per principal: daemon A's third claim answers at once with
Retry-After while its two wait, and daemon B's claim still waits. The control raises
the share to the whole bound: A's claims take every slot and B gets Retry-After.
tests/edge/test_parked_per_principal_server.py shows the parked bound on `make
run`'s server."""

import threading

import pytest
from django.contrib.auth.models import AnonymousUser

from accounts.authentication import authenticate_token
from edge.lean_path import LeanRequest
from jobs import waits
from jobs.wakeup import listener
from tests.edge.test_long_poll_admission import WAIT, claim, register
from tests.support import builders
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.security]


class Claims:
    """Claims long-polling in threads of their own; `start` returns once the server
    holds the claim's wait."""

    def __init__(self, base: str):
        self.base = base
        self.threads: list[threading.Thread] = []

    def start(self, daemon: str, token: str) -> None:
        before = waits.slots.held
        thread = threading.Thread(target=claim, args=(self.base, daemon, token), daemon=True)
        thread.start()
        wait_for(lambda: waits.slots.held == before + 1, what="the claim waiting", timeout=10)
        self.threads.append(thread)

    def holding(self) -> bool:
        return all(thread.is_alive() for thread in self.threads)

    def end(self) -> None:
        listener.release_waiters()
        for thread in self.threads:
            thread.join(30)


@pytest.fixture
def fleet(live_server, settings):
    settings.LAKESHORE_MAX_WAITS = 4
    settings.LAKESHORE_MAX_WAITS_PER_PRINCIPAL = 2
    builders.queue(name="w")
    bootstrap = builders.token("daemon")
    a = register(live_server.url, bootstrap, "a")
    b = register(live_server.url, bootstrap, "b")
    claims = Claims(live_server.url)
    yield a, b, claims
    claims.end()


@pytest.mark.parametrize("door", ["lean", "full"])
def test_past_its_share_a_daemons_claim_answers_at_once_and_another_still_waits(
    fleet, live_server, settings, door
):
    settings.LAKESHORE_LEAN_PATH = door == "lean"
    a, b, claims = fleet
    claims.start(*a)
    claims.start(*a)

    third = claim(live_server.url, *a)

    assert third.status_code == 200 and third.json() == []
    assert third.headers["Retry-After"] == str(int(WAIT))
    assert claims.holding(), "A's third answered only once its two waits ended"
    claims.start(*b)  # returns once the server holds B's wait: it was not refused
    assert waits.slots.held == 3


def test_control_with_the_share_raised_to_the_whole_bound_the_other_daemon_is_refused(
    fleet, live_server, settings
):
    settings.LAKESHORE_MAX_WAITS_PER_PRINCIPAL = 4
    a, b, claims = fleet
    for _ in range(4):
        claims.start(*a)

    answer = claim(live_server.url, *b)

    assert answer.status_code == 200 and answer.json() == []
    assert answer.headers["Retry-After"] == str(int(WAIT))
    assert claims.holding()


def test_a_principal_is_its_token_else_its_user():
    user, token = authenticate_token(builders.token("viewer"))
    assert waits.principal(LeanRequest({}, user, token)) == ("token", token.pk)
    assert waits.principal(LeanRequest({}, user, None)) == ("user", user.pk)  # a session
    assert waits.principal(LeanRequest({}, AnonymousUser(), None)) is None
    assert waits.principal(None) is None
