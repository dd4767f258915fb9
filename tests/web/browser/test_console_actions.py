"""The list pages' destructive buttons in Chromium: Drop a daemon and bulk-cancel a
queue's backlog, each asking first and saying what it did in the live region."""

import re

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from accounts.roles import grant
from fleet import controller
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.browser]


@pytest.fixture
def operator(page, live_server):
    def login(then: str):
        user = get_user_model().objects.create_user("olga", password="a-long-test-password")
        grant(user, "operator")
        page.goto(f"{live_server.url}{then}")
        page.fill("#id_username", "olga")
        page.fill("#id_password", "a-long-test-password")
        page.click("input[type=submit]")
        page.wait_for_url(f"{live_server.url}{then}")
        return page

    return login


def test_drop_asks_then_drops_and_says_what_ended(operator, live_server):
    builders.queue(name="train")
    services.invocation_submit(function="a.b", queue="train")
    daemon = builders.daemon(name="gpu-1", queues=["train"])
    builders.claim(daemon=daemon)
    page = operator("/daemons/")
    asked = []
    page.on("dialog", lambda dialog: asked.append(dialog.message) or dialog.accept())
    page.get_by_role("button", name=f"Drop daemon {daemon.pk}").click()
    status = page.get_by_role("status")
    expect(status).to_contain_text(
        f"Daemon {daemon.pk} (gpu-1) dropped; 1 running job(s) ended killed."
    )
    assert asked == [f"Drop daemon {daemon.pk} (gpu-1)? What it runs now ends killed."]
    assert Daemon.objects.get(pk=daemon.pk).state == "terminated"
    expect(page.locator("#daemon-table")).not_to_contain_text("gpu-1")  # live ones only


def test_bulk_cancel_counts_first_and_cancels_only_that_queue(operator, live_server):
    builders.queue(name="train")
    for _ in range(3):
        services.invocation_submit(function="a.b", queue="train")
    other, _ = services.invocation_submit(function="a.b")
    page = operator("/jobs/?queue=train")
    asked = []
    page.on("dialog", lambda dialog: asked.append(dialog.message) or dialog.accept())
    page.get_by_role("button", name="Cancel 3 queued in train").click()
    expect(page.get_by_role("status")).to_contain_text(
        "Cancelled 3 queued invocation(s) of queue train."
    )
    assert asked == ["Cancel 3 queued invocation(s) of queue train? Running ones are not touched."]
    assert page.url == f"{live_server.url}/jobs/?queue=train"
    assert Invocation.objects.filter(queue="train", state="killed").count() == 3
    other.refresh_from_db()
    assert other.state == "queued"


def test_the_chart_switches_between_the_hour_and_the_day_in_place(operator, live_server):
    builders.queue(name="train")
    services.invocation_submit(function="a.b", queue="train")
    controller.tick()  # a sample
    page = operator("/queues/train/")
    expect(page.locator("#queue-chart-heading")).to_have_text("Signals over the last hour")
    page.evaluate("window.__marker = 'same page'")
    page.get_by_role("link", name="Last day").click()
    expect(page.locator("#queue-chart-heading")).to_have_text("Signals over the last day")
    assert page.url == f"{live_server.url}/queues/train/?range=day"
    assert page.evaluate("window.__marker") == "same page"
    expect(page.get_by_role("img").first).to_have_attribute("aria-label", re.compile("pending 1"))
