"""What ended, in the console: the home page's fleet dashboard, the queue page's section
(figures, a throughput and a run-time panel, the top errors), their own refreshes, the
day's range, what they cost, and a sparkline that reads as a flat line on a scale."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.roles import grant
from jobs.models import Invocation
from queues.models import QueueSample
from queues.samples import minute_of
from tests.support import builders

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer_page(client):
    user = get_user_model().objects.create_user("vera", password="pw-x-12345")
    grant(user, "viewer")
    client.force_login(user)
    return client


def ended(state, *, queue="train", ago_s=30, ran_s=2.0, error=""):
    finished = timezone.now() - timedelta(seconds=ago_s)
    row = Invocation.objects.create(queue=queue, function="train.step", state=state, error=error)
    Invocation.objects.filter(pk=row.pk).update(
        created_at=finished - timedelta(seconds=ran_s + 1),
        started_at=finished - timedelta(seconds=ran_s),
        finished_at=finished,
    )
    return row


def section(body: str, section_id: str) -> str:
    start = body.index(f'id="{section_id}"')
    return body[start : body.index("</section>", start)]


def test_the_home_page_shows_the_fleet_and_what_ended(viewer_page):
    builders.queue(name="train")
    builders.daemon(queues=["train"], state="busy")
    builders.daemon(queues=["train"], state="idle")
    for _ in range(3):
        ended("succeeded")
    last = ended("failed", queue="", error="ValueError: bad shard 17")
    dashboard = section(viewer_page.get("/").content.decode(), "dashboard")
    assert "The fleet, last hour" in dashboard
    assert "<dd>0 pending · 0 running</dd>" in dashboard
    assert "(1 busy, 1 idle, 0 provisioning)" in dashboard
    assert "<dt>Succeeded</dt><dd>3 " in dashboard
    assert f'<a href="/jobs/{last.pk}/">{last.pk}</a>' in dashboard
    assert "state=failed&amp;state=timeout&amp;search=ValueError%3A%20bad%20shard%2017" in dashboard
    assert "Ended per minute" in dashboard and "Run time" in dashboard


def test_the_dashboard_refreshes_alone_at_a_fixed_cost(viewer_page):
    ended("succeeded")
    ended("failed", error="x failed")
    alone = viewer_page.get("/dashboard/", headers={"HX-Request": "true"}).content.decode()
    assert alone.lstrip().startswith('<section id="dashboard"') and "<html" not in alone
    with CaptureQueriesContext(connection) as few:
        viewer_page.get("/dashboard/")
    for i in range(30):
        ended("failed", error=f"error {i % 7}", ago_s=60 * i)
    with CaptureQueriesContext(connection) as many:
        viewer_page.get("/dashboard/")
    assert len(many) == len(few)


def test_the_queue_page_shows_what_ended_there_and_refreshes_it_alone(viewer_page):
    builders.queue(name="train")
    ended("succeeded", ran_s=4)
    ended("timeout", error="stopped after timeout_s=5 s", ran_s=5)
    ended("failed", queue="other", error="not this queue's")
    page = viewer_page.get("/queues/train/").content.decode()
    part = section(page, "queue-ended")
    assert "What ended in the last hour" in part
    assert "<dt>Timed out</dt><dd>1</dd>" in part
    assert "<dt>Ran</dt><dd>p50 4.0 s · p95 5.0 s · max 5.0 s</dd>" in part
    assert "stopped after timeout_s=5 s" in part and "not this queue" not in part
    assert "queue=train&amp;search=stopped%20after" in part
    alone = viewer_page.get(
        "/queues/train/?range=day", headers={"HX-Request": "true", "HX-Target": "queue-ended"}
    ).content.decode()
    assert alone.lstrip().startswith('<section id="queue-ended"')
    assert "What ended in the last day" in alone and "Ended per 15 minutes" in alone
    assert 'hx-get="/queues/train/?range=day"' in alone  # its refresh keeps the range


def test_quiet_panels_are_flat_lines_on_a_scale(viewer_page):
    builders.queue(name="train")
    part = section(viewer_page.get("/queues/train/").content.decode(), "queue-ended")
    throughput = re.search(r'class="chart-line line-succeeded" points="([^"]*)"', part).group(1)
    ys = {point.split(",")[1] for point in throughput.split()}
    assert len(ys) == 1 and len(throughput.split()) >= 60  # one flat line over the hour
    assert ">0</text>" in part and ">1</text>" in part  # its scale
    assert "No errors in the last hour." in part
    assert "<dt>Ran</dt><dd>-</dd>" in part


def test_a_quiet_queues_sparkline_is_a_flat_line_on_a_scale(viewer_page):
    queue = builders.queue(name="train")
    now = minute_of(timezone.now())
    for minutes in (2, 1, 0):
        QueueSample.objects.create(
            queue=queue,
            at=now - timedelta(minutes=minutes),
            pending=0,
            running=0,
            daemons=0,
            busy=0,
            desired=0,
            utilization=0.0,
        )
    body = viewer_page.get("/").content.decode()
    svg = re.search(r'<svg class="sparkline".*?</svg>', body, flags=re.S).group(0)
    assert 'aria-label="pending 0 → 0 over the last hour (scale 0 to 1)"' in svg
    axes = re.findall(r'<line class="spark-axis[^"]*" x1="(\d+)" x2="(\d+)"', svg)
    assert len(axes) == 2 and all(int(x2) - int(x1) > 90 for x1, x2 in axes)  # the whole hour
    assert '<text class="spark-scale"' in svg


@pytest.mark.parametrize("url", ["/api/v1/stats/", "/api/v1/queues/train/stats/?window=24h"])
def test_the_stats_answers_cost_the_same_whatever_ended(viewer, url):
    builders.queue(name="train")
    ended("succeeded")
    viewer.get(url)  # the token's first use is written once: not part of the answer
    with CaptureQueriesContext(connection) as few:
        assert viewer.get(url).status_code == 200
    for i in range(30):
        ended("failed", error=f"error {i % 7}", ago_s=60 * i)
    with CaptureQueriesContext(connection) as many:
        assert viewer.get(url).status_code == 200
    assert len(many) == len(few)


def test_the_queue_pages_ended_section_costs_the_same_whatever_ended(viewer_page):
    builders.queue(name="train")
    ended("succeeded")
    hx = {"HX-Request": "true", "HX-Target": "queue-ended"}
    with CaptureQueriesContext(connection) as few:
        viewer_page.get("/queues/train/", headers=hx)
    for i in range(30):
        ended("failed", error=f"error {i % 7}", ago_s=60 * i)
    with CaptureQueriesContext(connection) as many:
        viewer_page.get("/queues/train/", headers=hx)
    assert len(many) == len(few)
