import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.roles import grant
from fleet.models import Daemon
from jobs import services
from tests.support import builders

pytestmark = pytest.mark.django_db


def _login(client, role):
    user = get_user_model().objects.create_user(f"{role}-u", password="pw-x-12345")
    grant(user, role)
    client.force_login(user)
    return client


def test_it_lists_live_daemons_unless_asked_for_others(client):
    viewer = _login(client, "viewer")
    builders.daemon(name="gpu-live", queues=[])
    builders.daemon(name="gpu-gone", state="terminated")
    body = viewer.get("/daemons/").content.decode()
    assert "gpu-live" in body and "gpu-gone" not in body and "(default)" in body
    assert "Drop</button>" not in body  # a viewer gets no buttons
    assert 'hx-get="/daemons/" hx-target="#daemon-table"' in body
    assert "gpu-gone" in viewer.get("/daemons/?state=terminated").content.decode()


def test_an_operator_drops_a_daemon_and_its_work_ends_killed(client):
    operator = _login(client, "operator")
    inv, _ = services.invocation_submit(function="lakeshore.functions.echo")
    daemon = builders.daemon(name="gpu-1")
    builders.claim(daemon=daemon)
    response = operator.post(f"/daemons/{daemon.pk}/drop/")
    assert response.status_code == 302 and response["Location"] == "/daemons/"
    inv.refresh_from_db()
    assert Daemon.objects.get(pk=daemon.pk).state == "terminated" and inv.state == "killed"


def test_a_viewer_may_not_drop(client):
    viewer = _login(client, "viewer")
    daemon = builders.daemon(name="gpu-1")
    assert viewer.post(f"/daemons/{daemon.pk}/drop/").status_code == 403
    assert Daemon.objects.get(pk=daemon.pk).state == "idle"


def test_it_costs_the_same_queries_for_1_and_50_daemons(client):
    viewer = _login(client, "viewer")
    provider = builders.provider(name="sim")

    def count():
        with CaptureQueriesContext(connection) as ctx:
            assert viewer.get("/daemons/").status_code == 200
        return len(ctx)

    builders.daemon(provider=provider)
    one = count()
    for _ in range(49):
        daemon = builders.daemon(provider=provider)
        services.invocation_submit(function="a.b")
        builders.claim(daemon=daemon)  # each runs a job, shown on the page
    assert count() == one


def test_it_shows_every_job_a_daemon_runs_and_its_heartbeat_relative_with_the_time(client):
    viewer = _login(client, "viewer")
    daemon = builders.daemon(name="gpu-8", queues=[])
    jobs = [services.invocation_submit(function=f"a.job{i}")[0] for i in range(3)]
    builders.claim(daemon=daemon, limit=3)
    Daemon.objects.filter(pk=daemon.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=75)
    )
    body = viewer.get("/daemons/").content.decode()
    for job in jobs:
        assert f'href="/jobs/{job.pk}/"' in body and f"a.job{jobs.index(job)}" in body
    assert "1 minute ago" in body
    assert 'title="' in body and " UTC" in body  # the absolute time, time zone shown
    # below a minute it counts seconds (Django's timesince said "0 minutes")
    Daemon.objects.filter(pk=daemon.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=12)
    )
    body = viewer.get("/daemons/").content.decode()
    assert re.search(r'<time datetime="[^"]+" title="[^"]+ UTC">1[23] seconds ago</time>', body)
    assert "0 minutes" not in body and "0\xa0minutes" not in body
    assert f'href="/jobs/?worker={daemon.pk}"' in body


def test_a_job_s_worker_link_finds_the_daemon_even_once_it_ended(client):
    viewer = _login(client, "viewer")
    gone = builders.daemon(name="gpu-gone", state="terminated")
    builders.daemon(name="gpu-live")
    body = viewer.get(f"/daemons/?id={gone.pk}").content.decode()
    assert "gpu-gone" in body and "gpu-live" not in body


def test_a_drop_says_what_it_did_in_the_live_region(client):
    operator = _login(client, "operator")
    services.invocation_submit(function="a.b")
    daemon = builders.daemon(name="gpu-1")
    builders.claim(daemon=daemon)
    page = operator.get("/daemons/").content.decode()
    assert f'aria-label="Drop daemon {daemon.pk}"' in page and "hx-confirm=" in page
    body = operator.post(f"/daemons/{daemon.pk}/drop/", follow=True).content.decode()
    assert f"Daemon {daemon.pk} (gpu-1) dropped; 1 running job(s) ended killed." in body
    again = operator.post(f"/daemons/{daemon.pk}/drop/", follow=True).content.decode()
    assert f"Daemon {daemon.pk} (gpu-1) had already ended." in again


def test_a_huge_page_key_shows_the_first_page(client):
    viewer = _login(client, "viewer")
    builders.daemon(name="gpu-live")
    response = viewer.get("/daemons/?after=100000000000000000000000")
    assert response.status_code == 200 and "gpu-live" in response.content.decode()
