"""POST /api/v1/queues/NAME/{drain,pause,resume,archive,unarchive}/."""

import pytest

from queues.models import Queue
from tests.support import builders
from tests.support.assertions import assert_error
from tests.support.shapes import QUEUE_KEYS

pytestmark = pytest.mark.django_db


def act(client, name: str, action: str):
    return client.post(f"/api/v1/queues/{name}/{action}/")


def state_of(name: str) -> str:
    return Queue.objects.get(name=name).state


@pytest.mark.parametrize(
    "action, state",
    [("drain", "draining"), ("pause", "paused"), ("archive", "archived"), ("resume", "active")],
)
def test_it_moves_an_active_queue(operator, action, state):
    builders.queue(name="q")

    response = act(operator, "q", action)

    assert response.status_code == 200
    assert set(response.json()) == QUEUE_KEYS
    assert response.json()["state"] == state
    assert state_of("q") == state


@pytest.mark.parametrize("action", ["drain", "pause", "archive", "resume", "unarchive"])
def test_repeating_an_action_is_harmless(operator, action):
    builders.queue(name="q")
    act(operator, "q", action)

    response = act(operator, "q", action)

    assert response.status_code == 200
    assert response.json()["state"] == state_of("q")


def test_a_paused_queue_can_be_drained(operator):
    builders.queue(name="q")
    act(operator, "q", "pause")

    response = act(operator, "q", "drain")

    assert response.status_code == 200
    assert state_of("q") == "draining"


def test_pausing_a_draining_queue_says_to_resume_it(operator):
    builders.queue(name="q")
    act(operator, "q", "drain")

    response = act(operator, "q", "pause")

    error = assert_error(response, 409, "queue_state", says=["draining", "resume"])
    assert "lakeshore queues resume q" in error["message"]
    assert state_of("q") == "draining"


@pytest.mark.parametrize("action", ["drain", "pause"])
def test_acting_on_an_archived_queue_says_to_unarchive_it(operator, action):
    builders.queue(name="q")
    act(operator, "q", "archive")

    response = act(operator, "q", action)

    error = assert_error(response, 409, "queue_state", says=["archived", "unarchive"])
    assert "lakeshore queues unarchive q" in error["message"]
    assert state_of("q") == "archived"


@pytest.mark.parametrize("before", ["drain", "archive", "pause"])
@pytest.mark.parametrize("action", ["unarchive", "resume"])
def test_unarchive_and_resume_make_any_queue_active(operator, before, action):
    builders.queue(name="q")
    act(operator, "q", before)

    response = act(operator, "q", action)

    assert response.status_code == 200
    assert response.json()["state"] == "active"
    assert state_of("q") == "active"


def test_an_archived_queue_leaves_the_list_and_comes_back(operator):
    builders.queue(name="q")

    act(operator, "q", "archive")
    assert operator.get("/api/v1/queues/").json() == []
    assert [r["name"] for r in operator.get("/api/v1/queues/?state=archived").json()] == ["q"]

    act(operator, "q", "unarchive")
    assert [r["name"] for r in operator.get("/api/v1/queues/").json()] == ["q"]


def test_the_response_counts_members(operator):
    builders.queue(name="q")
    builders.daemon(queues=["q"])

    assert act(operator, "q", "drain").json()["members"] == 1


@pytest.mark.parametrize("action", ["drain", "pause", "resume", "archive", "unarchive"])
def test_it_answers_404_for_an_unknown_queue(operator, action):
    response = act(operator, "nope", action)

    assert_error(response, 404, "not_found", says="nope")


@pytest.mark.parametrize("action", ["drain", "pause", "resume", "archive", "unarchive"])
def test_it_takes_post_only(operator, action):
    builders.queue(name="q")

    response = operator.get(f"/api/v1/queues/q/{action}/")

    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert state_of("q") == "active"
