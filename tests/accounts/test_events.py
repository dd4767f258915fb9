"""The audit trail and /events/: every operator action is recorded with who did it and
through which door (API, CLI, console, Django admin), next to the controller's
decisions, in one timeline across queues."""

import io
import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken, AuditEvent
from accounts.roles import grant
from accounts.services import token_create
from fleet import services as fleet_services
from fleet.daemons import daemon_drop
from jobs import services as job_services
from queues import services
from queues.models import QueueEvent
from tests.support import builders

pytestmark = pytest.mark.django_db


def _user(name: str, role: str | None = "operator", **flags):
    user = get_user_model().objects.create_user(name, password="pw-x-12345", **flags)
    if role:
        grant(user, role)
    return user


def _last() -> AuditEvent:
    return AuditEvent.objects.order_by("-id").first()


def _api(name: str, agent: str = "python-httpx/0.28") -> APIClient:
    _, raw = token_create(username=name, role="operator")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_USER_AGENT=agent)
    return client


def test_an_api_pause_names_the_token_s_user_and_the_api():
    builders.queue(name="train")
    assert _api("alice").post("/api/v1/queues/train/pause/").status_code == 200
    row = _last()
    assert (row.actor, row.via, row.action, row.queue) == ("alice", "api", "queue.pause", "train")


def test_the_cli_is_told_apart_by_its_user_agent():
    builders.queue(name="train")
    cli = _api("bob", agent="lakeshore-cli/0.1.0")
    assert cli.post("/api/v1/queues/train/drain/").status_code == 200
    assert (_last().actor, _last().via, _last().action) == ("bob", "cli", "queue.drain")


def test_a_console_kill_names_the_session_user(client):
    builders.queue(name="train")
    job, _ = job_services.invocation_submit(function="a.b", queue="train")
    client.force_login(_user("carol"))
    client.post(f"/jobs/{job.pk}/kill/")
    row = _last()
    assert (row.actor, row.via, row.action, row.target) == (
        "carol",
        "console",
        "job.kill",
        f"job {job.pk}",
    )


def test_a_django_admin_action_names_the_staff_user(client):
    queue = builders.queue(name="train")
    client.force_login(_user("root", role=None, is_staff=True, is_superuser=True))
    client.post("/admin/queues/queue/", {"action": "queue_pause", "_selected_action": [queue.pk]})
    assert (_last().actor, _last().via, _last().action) == ("root", "admin", "queue.pause")


def test_work_without_a_request_is_the_system_s():
    builders.queue(name="train")
    services.queue_transition(name="train", action="pause")
    assert (_last().actor, _last().via) == ("system", "system")


def test_a_management_command_is_named_as_who_acted():
    call_command("create_token", "--user", "ci-bot", "--role", "operator", stdout=io.StringIO())
    assert (_last().actor, _last().via, _last().action) == (
        "manage.py create_token",
        "system",
        "token.create",
    )
    services.queue_transition(name=builders.queue(name="q").name, action="pause")
    assert _last().actor == "system"  # the command's name ended with it


def test_a_refused_action_records_nothing():
    builders.queue(name="train")
    services.queue_transition(name="train", action="archive")
    before = AuditEvent.objects.count()
    with pytest.raises(services.Conflict):
        services.queue_transition(name="train", action="pause")
    assert AuditEvent.objects.count() == before


def test_each_operator_action_is_recorded():
    builders.queue(name="train")
    services.queue_patch(name="train", changes={"description": "h100s", "max_depth": 9})
    job, _ = job_services.invocation_submit(function="a.b", queue="train")
    job_services.invocation_bulk_cancel(queue="train", reason="too many")
    job_services.invocation_retry(invocation_id=job.pk)
    daemon = builders.daemon(queues=["train"])
    daemon_drop(daemon=daemon)
    fleet_services.provider_create(name="here", kind="simulated")
    services.queue_delete(name="train", force=True)
    rows = list(AuditEvent.objects.order_by("id").values_list("action", "summary"))
    assert [action for action, _ in rows] == [
        "queue.create", "queue.patch", "jobs.bulk_cancel", "job.retry", "daemon.drop",
        "provider.create", "queue.remove",
    ]  # fmt: skip
    summaries = dict(rows)
    assert summaries["queue.patch"] == "changed description, max_depth"
    assert summaries["jobs.bulk_cancel"] == "cancelled 1 queued: too many"
    assert "(--force)" in summaries["queue.remove"]


@pytest.fixture
def viewer(client):
    client.force_login(_user("vera", role="viewer"))
    return client


def _decision(queue, action="scale_up", at=None, reason="P=3: launching 1"):
    return QueueEvent.objects.create(
        queue=queue, at=at or timezone.now(), action=action, reason=reason, daemons=1,
        busy=1, pending=3, utilization=1.0, desired=2, delta=1,
    )  # fmt: skip


def test_the_timeline_merges_decisions_and_actions_newest_first(viewer):
    train = builders.queue(name="train")
    _decision(train, at=timezone.now() - timedelta(minutes=5))
    _decision(train, action="tick_noop", reason="nothing to do")
    services.queue_transition(name="train", action="pause")
    body = viewer.get("/events/").content.decode()
    table = body.split("<table")[1]
    assert table.index("queue.pause") < table.index("scale_up")
    assert "tick_noop" not in body.split("<table")[1]  # hidden unless asked for
    assert "nothing to do" in viewer.get("/events/?noop=1").content.decode()
    assert "D=1 B=1 P=3 U=1.00" in body and "daemons, busy, pending, utilisation" in body


def test_the_timeline_filters_by_queue_action_actor_and_time(viewer):
    train, other = builders.queue(name="train"), builders.queue(name="other")
    old = timezone.now() - timedelta(days=2)
    _decision(train, at=old, reason="long ago")
    _decision(other, reason="other queue")
    services.queue_transition(name="train", action="pause")
    only_train = viewer.get("/events/?queue=train").content.decode()
    assert "long ago" in only_train and "other queue" not in only_train
    by_action = viewer.get("/events/?action=queue.pause").content.decode()
    assert "queue.pause" in by_action and "other queue" not in by_action
    controller = viewer.get("/events/?actor=controller").content.decode()
    assert "other queue" in controller and "queue.pause" not in controller.split("<table")[1]
    since = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    recent = viewer.get(f"/events/?since={since}").content.decode()
    assert "other queue" in recent and "long ago" not in recent
    bad = viewer.get("/events/?since=yesterday").content.decode()
    assert 'role="alert"' in bad and "since:" in bad


def test_the_timeline_pages_by_cursor_without_gaps_or_repeats(viewer):
    train = builders.queue(name="train")
    at = timezone.now()
    for i in range(60):
        _decision(train, at=at, reason=f"decision {i:02d}")  # all at the same moment
    for _ in range(5):
        services.queue_transition(name="train", action="pause")
    first = viewer.get("/events/")
    seen = first.content.decode().count('<tr class="event-')
    assert seen == 50
    older = re.search(r'href="(/events/\?after=[^"]+)"[^>]*>Older', first.content.decode())
    second = viewer.get(older.group(1)).content.decode()
    assert second.count('<tr class="event-') == 16  # 60 + 5 pauses + the queue's creation
    both = first.content.decode() + second
    assert all(both.count(f">decision {i:02d} ") == 1 for i in range(60))


def test_a_timeline_page_costs_the_same_queries_for_1_and_50_rows(viewer):
    train = builders.queue(name="train")

    def count():
        with CaptureQueriesContext(connection) as ctx:
            assert viewer.get("/events/").status_code == 200
        return len(ctx)

    _decision(train)
    one = count()
    for _ in range(49):
        _decision(train)
    assert count() == one


def test_actions_outlive_their_queue(viewer):
    builders.queue(name="gone")
    services.queue_transition(name="gone", action="pause")
    services.queue_delete(name="gone")
    body = viewer.get("/events/?queue=gone").content.decode()
    assert "queue.pause" in body and "queue.remove" in body


def test_tokens_made_and_revoked_by_people_are_recorded_a_provider_s_own_are_not(client):
    token, _ = token_create(username="ci-bot", role="operator", name="ci")
    assert (_last().action, _last().summary) == ("token.create", "operator token for ci-bot (ci)")
    before = AuditEvent.objects.count()
    token_create(username="provider-here", role="daemon", audited=False)
    assert AuditEvent.objects.count() == before
    client.force_login(_user("root", role=None, is_staff=True, is_superuser=True))
    client.post("/admin/accounts/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    assert (_last().actor, _last().via, _last().action) == ("root", "admin", "token.revoke")
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None


def test_dropping_a_daemon_that_already_ended_records_nothing():
    daemon = builders.daemon(name="gpu-1")
    daemon_drop(daemon=daemon)
    daemon_drop(daemon=daemon)  # nothing left to do
    assert AuditEvent.objects.filter(action="daemon.drop").count() == 1
