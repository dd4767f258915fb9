"""The console's details as the server writes them: the favicon, the navigation's
current page, a list's error region that its refresh leaves alone, events linking what
they name, and the queue list's cells labelled for the phone's cards."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.roles import grant
from accounts.services import token_create
from fleet.daemons import daemon_drop
from fleet.models import Daemon
from jobs import services as job_services
from jobs.templatetags.console_tags import link_refs
from tests.support import builders

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    user = get_user_model().objects.create_user("olga", password="pw-for-tests-only")
    grant(user, "operator")
    client.force_login(user)
    return client


def test_favicon_ico_redirects_to_the_static_icon_without_a_login(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/favicon.svg"
    assert client.post("/favicon.ico").status_code == 405


def test_the_nav_marks_the_current_page_and_the_section_of_a_page_below_it(operator):
    body = operator.get("/jobs/").content.decode()
    assert '<a href="/jobs/" aria-current="page">Jobs</a>' in body
    assert body.count("aria-current=") == 1
    body = operator.get("/queues/add/").content.decode()
    assert '<a href="/" aria-current="true">Queues</a>' in body
    assert '<a class="skip" href="#content">Skip to content</a>' in body
    assert '<main id="content" tabindex="-1">' in body


def test_a_list_error_lives_outside_the_box_that_refreshes(operator):
    page = operator.get("/jobs/?since=soon").content.decode()
    region = re.search(
        r'<div id="job-table-alert" class="list-alert" role="alert">(.*?)</div>', page
    )
    assert region and "since" in region.group(1)
    table = page[page.index('<div id="job-table"') :]
    assert 'role="alert"' not in table
    # the box's own refresh (htmx names the box as the trigger) leaves the region alone
    refresh = operator.get(
        "/jobs/?since=soon",
        headers={"HX-Request": "true", "HX-Target": "job-table", "HX-Trigger": "job-table"},
    ).content.decode()
    assert "job-table-alert" not in refresh and 'role="alert"' not in refresh
    # a new filter says what is wrong now, out of band, into the region
    changed = operator.get(
        "/jobs/?since=later", headers={"HX-Request": "true", "HX-Target": "job-table"}
    ).content.decode()
    assert re.search(r'<div id="job-table-alert"[^>]*hx-swap-oob="innerHTML">.*since', changed)
    fixed = operator.get(
        "/jobs/", headers={"HX-Request": "true", "HX-Target": "job-table"}
    ).content.decode()
    assert (
        '<div id="job-table-alert" class="list-alert" role="alert" hx-swap-oob="innerHTML"></div>'
        in fixed
    )


def test_the_events_link_the_job_and_the_daemon_with_one_query_for_the_names(operator):
    builders.queue(name="train")
    job, _ = job_services.invocation_submit(function="a.b", queue="train")
    job_services.invocation_kill(invocation_id=job.pk)
    daemons = [builders.daemon(name=f"gpu-{i}", queues=["train"]) for i in range(3)]
    daemon_drop(daemon=daemons[0])
    with CaptureQueriesContext(connection) as one:
        body = operator.get("/events/").content.decode()
    assert f'<a href="/jobs/{job.pk}/">job {job.pk}</a>' in body
    first = daemons[0].pk
    assert f'<a href="/daemons/?id={first}">daemon {first}</a>' in body
    assert f'dropped <a href="/daemons/?id={first}">gpu-0</a> (serving train)' in body
    for daemon in daemons[1:]:
        daemon_drop(daemon=daemon)
    with CaptureQueriesContext(connection) as three:
        body = operator.get("/events/").content.decode()
    assert len(three) == len(one)
    assert f'<a href="/daemons/?id={daemons[2].pk}">gpu-2</a>' in body
    # a target without a page (a token) stays text
    builders.queue(name="eval")
    token_create(username="olga", role="viewer", name="ci")
    assert re.search(r"<strong>token [^<]+…</strong>: ", operator.get("/events/").content.decode())


def test_every_cell_of_the_queue_list_is_labelled_for_the_cards(operator):
    builders.queue(name="train")
    body = operator.get("/").content.decode()
    assert '<table class="stack">' in body
    row = re.search(r"<tr>\s*<td data-label=\"Name\">.*?</tr>", body, re.S).group(0)
    cells = re.findall(r"<td\b[^>]*>", row)
    assert len(cells) == 14 and all("data-label=" in cell for cell in cells)


def test_the_queue_page_refreshes_its_member_daemons_with_their_heartbeats(operator):
    builders.queue(name="train")
    daemon = builders.daemon(name="gpu-1", queues=["train"])
    Daemon.objects.filter(pk=daemon.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=12)
    )
    page = operator.get("/queues/train/").content.decode()
    assert '<div id="queue-members" hx-get="/queues/train/" hx-trigger="every 5s"' in page
    box = operator.get(
        "/queues/train/", headers={"HX-Request": "true", "HX-Target": "queue-members"}
    ).content.decode()
    assert box.lstrip().startswith('<div id="queue-members"') and "<html" not in box
    assert re.search(r">1[2-4] seconds ago</time>", box) and "gpu-1" in box


def test_a_job_s_timeline_links_the_daemon_and_the_jobs_it_names(operator):
    assert link_refs("attempt 1 of 3 started on daemon 7 <b>") == (
        'attempt 1 of 3 started on <a href="/daemons/?id=7">daemon 7</a> &lt;b&gt;'
    )
    assert link_refs("retried as job 12") == 'retried as <a href="/jobs/12/">job 12</a>'
    assert link_refs("jobs 3 and daemonic 4") == "jobs 3 and daemonic 4"  # whole words only
    job, _ = job_services.invocation_submit(function="a.b")
    daemon = builders.daemon(name="gpu-1", queues=[])
    builders.claim(daemon=daemon)
    body = operator.get(f"/jobs/{job.pk}/").content.decode()
    assert f'started on <a href="/daemons/?id={daemon.pk}">daemon {daemon.pk}</a>' in body
