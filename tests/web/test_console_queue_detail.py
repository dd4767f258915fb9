import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.roles import grant
from queues.models import Queue
from tests.support import builders

pytestmark = pytest.mark.django_db


def _login(client, role):
    user = get_user_model().objects.create_user(f"{role}-user", password="pw-for-tests-only")
    grant(user, role)
    client.force_login(user)
    return client


@pytest.fixture
def operator(client):
    return _login(client, "operator")


@pytest.fixture
def viewer(client):
    return _login(client, "viewer")


def test_it_shows_a_queue_its_signals_members_and_decisions(viewer):
    builders.queue(name="train", elasticity_spec={"kind": "fixed", "min": 1})
    builders.daemon(queues=["train"], name="gpu-1")
    body = viewer.get("/queues/train/").content.decode()
    assert "train" in body and "fixed 1" in body and "gpu-1" in body
    assert "Next action" in body and "queue.create" in body  # its timeline so far


def test_a_viewer_sees_no_buttons_and_may_not_act(viewer):
    builders.queue(name="train")
    assert "Drain</button>" not in viewer.get("/queues/train/").content.decode()
    assert viewer.post("/queues/train/drain/").status_code == 403
    assert Queue.objects.get(name="train").state == "active"


def test_an_operator_drains_through_htmx_and_gets_the_summary_back(operator):
    builders.queue(name="train")
    response = operator.post("/queues/train/drain/", headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="queue-summary"')
    assert "state-draining" in body
    assert Queue.objects.get(name="train").state == "draining"


def test_a_refused_action_says_why_in_the_page(operator):
    builders.queue(name="train")
    operator.post("/queues/train/archive/")
    response = operator.post("/queues/train/pause/", headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert "Cannot pause queue &#x27;train&#x27;: it is archived" in response.content.decode()


def test_without_htmx_an_action_redirects_back(operator):
    builders.queue(name="train")
    response = operator.post("/queues/train/pause/")
    assert response.status_code == 302 and response["Location"] == "/queues/train/"


def test_unknown_queues_and_actions_are_404(operator):
    assert operator.get("/queues/nope/").status_code == 404
    builders.queue(name="train")
    assert operator.post("/queues/train/explode/").status_code == 404
    assert operator.get("/queues/train/drain/").status_code == 405


def test_it_costs_the_same_queries_for_1_and_50_members(viewer):
    builders.queue(name="train")

    def count():
        with CaptureQueriesContext(connection) as ctx:
            assert viewer.get("/queues/train/").status_code == 200
        return len(ctx)

    builders.daemon(queues=["train"])
    one = count()
    for _ in range(49):
        builders.daemon(queues=["train"])
    assert count() == one
