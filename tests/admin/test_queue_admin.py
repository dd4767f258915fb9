import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import Provider
from jobs.models import Invocation
from jobs.services import invocation_submit
from queues.models import Queue, QueueEvent
from tests.support import builders

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client):
    user = get_user_model().objects.create_superuser("root", "", "pw-for-tests-only")
    client.force_login(user)
    return client


def _form(**overrides):
    data = {
        "name": "eval",
        "kind": "priority",
        "description": "evaluation, urgent first",
        "provider": "",
        "elasticity_kind": "",
        "elasticity_min": "",
        "elasticity_max": "",
        "elasticity_threshold": "",
        "instance_type": "",
        "image_id": "",
        "runner": "",
        "max_depth": "",
        "on_full": "reject",
        "temperature": "1.0",
    }
    data.update(overrides)
    return data


def test_it_lists_queues_with_members(staff):
    builders.queue(name="training-h100")
    builders.daemon(queues=["training-h100"])
    response = staff.get("/admin/queues/queue/")
    assert response.status_code == 200
    assert b"training-h100" in response.content


def test_it_adds_a_queue_through_the_service(staff):
    response = staff.post("/admin/queues/queue/add/", _form())
    assert response.status_code == 302, response.content.decode()[:2000]
    queue = Queue.objects.get(name="eval")
    assert queue.kind == "priority"


def test_it_shows_the_elasticity_rule_on_the_form(staff):
    response = staff.post(
        "/admin/queues/queue/add/",
        _form(elasticity_kind="max_count", elasticity_min="2", elasticity_max="4"),
    )
    assert response.status_code == 200
    assert b"does not use min" in response.content
    assert not Queue.objects.filter(name="eval").exists()


def test_it_drains_with_an_action(staff):
    queue = builders.queue(name="eval")
    response = staff.post(
        "/admin/queues/queue/",
        {"action": "queue_drain", "_selected_action": [queue.pk]},
    )
    assert response.status_code == 302
    queue.refresh_from_db()
    assert queue.state == "draining"


def test_it_refuses_to_delete_a_queue_with_bound_daemons(staff):
    queue = builders.queue(name="eval")
    builders.daemon(queues=["eval"], name="gpu-1")
    response = staff.post(
        "/admin/queues/queue/",
        {"action": "delete_selected", "_selected_action": [queue.pk], "post": "yes"},
        follow=True,
    )
    assert response.status_code == 200
    assert b"gpu-1" in response.content
    assert Queue.objects.filter(name="eval").exists()


def test_it_lists_invocations(staff):
    Invocation.objects.create(function="lakeshore.functions.echo")
    response = staff.get("/admin/jobs/invocation/")
    assert response.status_code == 200
    assert b"lakeshore.functions.echo" in response.content


def test_it_changes_elasticity_numbers_through_the_service(staff):
    queue = builders.queue(
        name="eval", elasticity_spec={"kind": "pool_with_threshold", "threshold": 0.5}
    )
    form = _form(
        kind="fifo",
        description="h100 prod",
        elasticity_min="0",
        elasticity_max="8",
        elasticity_threshold="0.6",
    )
    response = staff.post(f"/admin/queues/queue/{queue.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[:3000]
    queue.refresh_from_db()
    assert (queue.description, queue.elasticity_max, queue.elasticity_threshold) == (
        "h100 prod",
        8,
        0.6,
    )


def test_it_refuses_a_bad_threshold_on_change(staff):
    queue = builders.queue(
        name="eval", elasticity_spec={"kind": "pool_with_threshold", "threshold": 0.5}
    )
    form = _form(elasticity_min="0", elasticity_threshold="1.5")
    response = staff.post(f"/admin/queues/queue/{queue.pk}/change/", form)
    assert response.status_code == 200
    assert b"threshold must be in (0, 1]" in response.content
    queue.refresh_from_db()
    assert queue.elasticity_threshold == 0.5


@pytest.mark.parametrize(
    "url",
    [
        "/admin/",
        "/admin/queues/queue/",
        "/admin/queues/queue/add/",
        "/admin/fleet/provider/",
        "/admin/fleet/provider/add/",
        "/admin/fleet/daemon/",
        "/admin/queues/queueevent/",
        "/admin/jobs/invocation/",
        "/admin/accounts/apitoken/",
        "/admin/auth/user/",
    ],
)
def test_every_admin_page_opens(staff, url):
    builders.queue(name="eval")
    builders.daemon(queues=["eval"])
    assert staff.get(url).status_code == 200


def test_each_object_page_opens(staff):
    queue = builders.queue(name="eval", elasticity_spec={"kind": "fixed", "min": 1})
    provider = builders.provider(name="gpu")
    daemon = builders.daemon(queues=["eval"])
    invocation = Invocation.objects.create(function="lakeshore.functions.echo", queue="eval")
    event = QueueEvent.objects.create(
        queue=queue, at="2026-01-01T00:00:00Z", action="tick_noop", reason="-",
        daemons=1, busy=0, pending=0, utilization=0, desired=1,
    )  # fmt: skip
    for url in [
        f"/admin/queues/queue/{queue.pk}/change/",
        f"/admin/fleet/provider/{provider.pk}/change/",
        f"/admin/fleet/daemon/{daemon.pk}/change/",
        f"/admin/jobs/invocation/{invocation.pk}/change/",
        f"/admin/queues/queueevent/{event.pk}/change/",
    ]:
        assert staff.get(url).status_code == 200, url


def test_it_kills_queued_invocations_with_an_action(staff):
    inv, _ = invocation_submit(function="lakeshore.functions.echo")
    response = staff.post(
        "/admin/jobs/invocation/", {"action": "kill", "_selected_action": [inv.pk]}
    )
    assert response.status_code == 302
    inv.refresh_from_db()
    assert (inv.state, inv.reason) == ("killed", "killed in admin")


def test_it_drops_daemons_with_an_action(staff):
    daemon = builders.daemon(queues=[])
    response = staff.post(
        "/admin/fleet/daemon/", {"action": "drop", "_selected_action": [daemon.pk]}
    )
    assert response.status_code == 302
    daemon.refresh_from_db()
    assert daemon.state == "terminated"


def test_it_refuses_credentials_in_a_providers_config(staff):
    response = staff.post(
        "/admin/fleet/provider/add/",
        {"name": "gpu", "kind": "simulated", "description": "", "config": '{"api_key": "x"}'},
    )
    assert response.status_code == 200
    assert b"must not hold credentials" in response.content
    assert not Provider.objects.exists()
    response = staff.post(
        "/admin/fleet/provider/add/",
        {"name": "gpu", "kind": "simulated", "description": "", "config": '{"startup_seconds": 1}'},
    )
    assert response.status_code == 302
    assert Provider.objects.get().config == {"startup_seconds": 1}


@pytest.mark.parametrize(
    "url, make",
    [
        ("/admin/queues/queue/", lambda i: builders.daemon(queues=[builders.queue().name])),
        ("/admin/fleet/daemon/", lambda i: builders.daemon(provider=builders.provider())),
        (
            "/admin/jobs/invocation/",
            lambda i: Invocation.objects.create(function="a.b", daemon=builders.daemon()),
        ),
    ],
)
def test_admin_lists_cost_the_same_queries_for_1_and_50_rows(staff, url, make):
    def count():
        with CaptureQueriesContext(connection) as ctx:
            assert staff.get(url).status_code == 200
        return len(ctx)

    make(0)
    one = count()
    for i in range(1, 50):
        make(i)
    assert count() == one
