import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.roles import grant
from tests import builders

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(client):
    user = get_user_model().objects.create_user("alice", password="pw-for-tests-only")
    grant(user, "viewer")  # the console needs a role (tests/web/test_console_roles.py)
    client.force_login(user)
    return client


def test_it_asks_for_a_login(client):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_it_lists_queues_with_members_and_elasticity(alice):
    builders.queue(
        name="training-h100",
        elasticity_spec={"kind": "pool_with_threshold", "min": 2, "max": 16, "threshold": 0.7},
    )
    builders.daemon(queues=["training-h100"])
    builders.queue(name="retired-queue")
    from queues.services import queue_transition

    queue_transition(name="retired-queue", action="archive")
    body = alice.get("/").content.decode()
    assert "training-h100" in body and "pool-with-threshold 2..16 @0.7" in body
    assert ">1</td>" in body  # one member
    assert "retired-queue" not in body  # archived queues are hidden unless asked for


def test_an_htmx_request_gets_only_the_table(alice):
    builders.queue(name="retired-queue")
    from queues.services import queue_transition

    queue_transition(name="retired-queue", action="archive")
    response = alice.get("/?state=archived", headers={"HX-Request": "true"})
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="queue-table">')
    assert "retired-queue" in body and "<html" not in body


def test_it_costs_the_same_queries_for_1_and_50_queues(alice):
    def count():
        with CaptureQueriesContext(connection) as ctx:
            assert alice.get("/").status_code == 200
        return len(ctx)

    builders.queue(name="q0")
    one = count()
    for i in range(1, 50):
        builders.queue(name=f"q{i}")
        builders.daemon(queues=[f"q{i}"])
    assert count() == one


def test_it_says_how_to_add_a_queue_when_there_is_none(alice):
    assert "lakeshore queues add NAME" in alice.get("/").content.decode()


@pytest.mark.parametrize("url", ["/?offset=100000000000000000000000", "/?offset=-3", "/?offset=x"])
def test_a_garbled_page_offset_shows_the_first_page(alice, url):
    builders.queue(name="training-h100")
    response = alice.get(url)
    assert response.status_code == 200 and "training-h100" in response.content.decode()
