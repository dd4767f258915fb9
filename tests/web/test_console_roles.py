"""The console applies the API's roles: no role, no page; viewers read; operators (and
staff) act. Every console route goes through one check (accounts.console_access.console_view)."""

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from accounts.models import ApiToken
from accounts.roles import grant
from accounts.services import token_create
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from lakeshore_admin import urls
from queues.models import Queue
from tests.support import builders

pytestmark = pytest.mark.django_db

PAGES = [
    "/",
    "/dashboard/",
    "/queues/train/",
    "/jobs/",
    "/daemons/",
    "/jobs/{job}/",
    "/jobs/{job}/log/",
    "/jobs/{job}/log.txt",
    "/events/",
    "/tokens/",
]
FORMS = ["/queues/add/", "/queues/train/edit/"]  # for operators only, even to read
ACTIONS = [
    "/queues/train/pause/",
    "/daemons/{daemon}/drop/",
    "/jobs/{job}/kill/",
    "/daemons/{daemon}/jobs/{job}/stop/",
    "/tokens/{token}/revoke/",
]
CONSOLE_APPS = ("queues", "jobs", "fleet", "accounts")  # the URL namespaces of the pages
POSTS = (
    "/pause/",
    "/drop/",
    "/kill/",
    "/stop/",
    "/retry/",
    "/bulk-cancel/",
    "/bulk-retry/",
    "/revoke/",
)


@pytest.fixture
def world():
    builders.queue(name="train")
    job, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="train")
    token, _ = token_create(username="ci-bot", role="operator")
    daemon = builders.daemon(queues=["train"], name="gpu-1")
    return {"daemon": daemon.pk, "job": job.pk, "token": token.pk}


def login(client, role: str | None = None, **flags):
    user = get_user_model().objects.create_user(
        f"{role or 'nobody'}-user", password="pw-for-tests-only", **flags
    )
    if role:
        grant(user, role)
    client.force_login(user)
    return client


def assert_unchanged(world):
    assert Queue.objects.get(name="train").state == "active"
    assert Daemon.objects.get(pk=world["daemon"]).state == "idle"
    assert Invocation.objects.get(pk=world["job"]).state == "queued"
    assert not Invocation.objects.filter(retry_of=world["job"]).exists()
    assert ApiToken.objects.get(pk=world["token"]).revoked_at is None


def console_routes(world) -> list[tuple[str, str]]:
    """Every console route of the apps' urls.py, as (method, url): the test below keeps up
    with it."""
    args = {
        "name": "train",
        "action": "pause",
        "daemon_id": world["daemon"],
        "invocation_id": world["job"],
        "token_id": world["token"],
    }
    routes = []
    for app in urls.urlpatterns:
        if getattr(app, "namespace", None) not in CONSOLE_APPS:
            continue
        for pattern in app.url_patterns:
            wanted = {key: args[key] for key in pattern.pattern.converters}
            url = reverse(f"{app.namespace}:{pattern.name}", kwargs=wanted)
            routes.append(("post" if url.endswith(POSTS) else "get", url))
    return routes


def test_every_console_route_refuses_a_user_without_a_role(client, world):
    nobody = login(client)
    routes = console_routes(world)
    assert {url for _, url in routes} == {
        *(url.format(**world) for url in PAGES + FORMS),
        *(url.format(**world) for url in ACTIONS),
        f"/jobs/{world['job']}/retry/",
        "/jobs/bulk-cancel/",
        "/jobs/bulk-retry/",
    }
    for method, url in routes:
        response = getattr(nobody, method)(url)
        assert response.status_code == 403, (method, url, response.status_code)
    assert_unchanged(world)


@pytest.mark.parametrize("url", PAGES)
def test_the_403_page_names_the_role_and_who_grants_it(client, world, url):
    response = login(client).get(url.format(**world))

    body = response.content.decode()
    assert response.status_code == 403
    assert "without a role" in body and "<strong>viewer</strong>" in body
    assert "manage.py create_token --user nobody-user --role viewer" in body
    assert "Django admin" in body and "<code>viewer</code>" in body


def test_an_htmx_refresh_without_a_role_is_refused_too(client, world):
    response = login(client).get(
        "/queues/train/", headers={"HX-Request": "true", "HX-Target": "queue-summary"}
    )
    assert response.status_code == 403 and "gpu-1" not in response.content.decode()


@pytest.mark.parametrize("url", PAGES)
@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_viewers_and_operators_read_every_page(client, world, url, role):
    assert login(client, role).get(url.format(**world)).status_code == 200


@pytest.mark.parametrize("url", FORMS)
def test_forms_are_for_operators(client, world, url):
    assert login(client, "viewer").get(url).status_code == 403
    assert login(client, "operator").get(url).status_code == 200


@pytest.mark.parametrize("url", ACTIONS)
def test_a_viewer_may_not_act_and_is_told_what_it_needs(client, world, url):
    response = login(client, "viewer").post(url.format(**world))

    body = response.content.decode()
    assert response.status_code == 403
    assert "needs the operator role" in body and "with the role viewer" in body
    assert "--role operator" in body
    assert_unchanged(world)


def test_a_viewer_sees_no_action_buttons(client, world):
    viewer = login(client, "viewer")
    assert "Pause</button>" not in viewer.get("/queues/train/").content.decode()
    assert "Drop</button>" not in viewer.get("/daemons/").content.decode()


@pytest.mark.parametrize("who", [{"role": "operator"}, {"is_staff": True}])
def test_operators_and_staff_see_the_buttons_and_act(client, world, who):
    actor = login(client, **who)
    assert "Pause</button>" in actor.get("/queues/train/").content.decode()
    assert "Drop</button>" in actor.get("/daemons/").content.decode()

    assert actor.post("/queues/train/pause/").status_code == 302
    assert actor.post(f"/daemons/{world['daemon']}/drop/").status_code == 302
    assert Queue.objects.get(name="train").state == "paused"
    assert Daemon.objects.get(pk=world["daemon"]).state == "terminated"


@pytest.mark.parametrize("url", PAGES + FORMS)
def test_a_visitor_is_sent_to_log_in(client, world, url):
    response = client.get(url.format(**world))
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")


@pytest.mark.parametrize("url", ACTIONS)
def test_a_visitor_may_not_act(client, world, url):
    response = client.post(url.format(**world))
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert_unchanged(world)


def test_the_nav_shows_django_admin_only_to_staff(client, world):
    operator = login(client, "operator")
    assert 'href="/admin/"' not in operator.get("/").content.decode()

    staff = get_user_model().objects.create_user("root", password="pw-x", is_staff=True)
    client.force_login(staff)
    assert 'href="/admin/"' in client.get("/").content.decode()
