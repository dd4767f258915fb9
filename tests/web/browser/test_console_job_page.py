"""The job page in Chromium: Retry and Kill (with its confirmation), the live region,
a refresh that keeps focus, and a session that ends under a refreshing page."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from playwright.sync_api import expect

from accounts.roles import grant
from jobs import services
from jobs.models import Invocation
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.browser]


@pytest.fixture
def fast_refresh(settings):
    settings.LAKESHORE_CONSOLE_REFRESH_SECONDS = 1


def _login(page, live_server, role: str, then: str):
    user = get_user_model().objects.create_user(f"u-{role}", password="a-long-test-password")
    grant(user, role)
    page.goto(f"{live_server.url}{then}")
    page.fill("#id_username", f"u-{role}")
    page.fill("#id_password", "a-long-test-password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}{then}")
    return page


def _queued() -> Invocation:
    builders.queue(name="train")
    return services.invocation_submit(function="lakeshore.functions.echo", queue="train")[0]


def test_retry_lands_on_the_new_job_and_says_so_until_dismissed(page, live_server):
    old = _queued()
    Invocation.objects.filter(pk=old.pk).update(state="failed", error="ValueError: nope")
    _login(page, live_server, "operator", f"/jobs/{old.pk}/")
    page.get_by_role("button", name=f"Retry job {old.pk}").click()
    page.wait_for_url(lambda url: not url.endswith(f"/jobs/{old.pk}/"))
    new = Invocation.objects.get(retry_of=old)
    assert page.url == f"{live_server.url}/jobs/{new.pk}/"
    status = page.get_by_role("status")
    expect(status).to_contain_text(f"Job {old.pk} retried as job {new.pk}.")
    expect(page.locator("#job-summary")).to_contain_text(f"job {old.pk}")  # Retry of
    status.get_by_role("button", name=f"Dismiss: Job {old.pk} retried as job {new.pk}.").click()
    expect(status).not_to_contain_text("retried")


def test_kill_asks_first_and_a_no_leaves_the_job_queued(page, live_server):
    job = _queued()
    _login(page, live_server, "operator", f"/jobs/{job.pk}/")
    asked = []

    def answer(dialog):
        asked.append(dialog.message)
        dialog.accept() if len(asked) > 1 else dialog.dismiss()

    page.on("dialog", answer)
    page.get_by_role("button", name=f"Kill job {job.pk}").click()
    page.wait_for_timeout(300)
    job.refresh_from_db()
    assert job.state == "queued" and asked == [f"Kill job {job.pk}? It will not run."]
    page.get_by_role("button", name=f"Kill job {job.pk}").click()
    expect(page.get_by_role("status")).to_contain_text(f"Job {job.pk} killed.")
    expect(page.locator("#job-summary .state")).to_have_text("killed")
    job.refresh_from_db()
    assert job.state == "killed"


def test_a_refresh_keeps_the_focus_where_it_was(page, live_server, fast_refresh):
    job = _queued()
    _login(page, live_server, "operator", f"/jobs/{job.pk}/")
    page.get_by_role("button", name=f"Kill job {job.pk}").focus()
    for _ in range(2):  # two refreshes of the box holding the focused button
        with page.expect_response(lambda r: r.url.endswith(f"/jobs/{job.pk}/")):
            pass
    page.wait_for_timeout(200)  # the swap settles
    focused = page.evaluate("document.activeElement.getAttribute('aria-label')")
    assert focused == f"Kill job {job.pk}"


def test_when_the_session_ends_a_refresh_brings_the_whole_login_page(
    page, live_server, fast_refresh
):
    job = _queued()
    _login(page, live_server, "viewer", f"/jobs/{job.pk}/")
    Session.objects.all().delete()  # the session ends (expiry, logout elsewhere)
    page.wait_for_url(f"{live_server.url}/login/?next=/jobs/{job.pk}/", timeout=10_000)
    assert page.locator("#id_username").count() == 1  # one login form, not one inside the page
    assert page.locator("#job-summary").count() == 0


def test_back_after_filtering_shows_the_filter_that_was_used(page, live_server):
    _queued()
    other, _ = services.invocation_submit(function="eval.run", queue="train")
    _login(page, live_server, "viewer", "/jobs/")
    page.fill("input[name=function]", "eval.")
    page.press("input[name=function]", "Enter")
    page.wait_for_url(f"{live_server.url}/jobs/?**function=eval.**")
    table = page.locator("#job-table")
    expect(table).not_to_contain_text("lakeshore.functions.echo", timeout=20_000)
    table.get_by_role("link", name="eval.run").click()
    page.wait_for_url(f"{live_server.url}/jobs/{other.pk}/")
    page.go_back()
    page.wait_for_url(f"{live_server.url}/jobs/?**function=eval.**")
    expect(page.locator("input[name=function]")).to_have_value("eval.", timeout=20_000)
    expect(page.locator("#job-table")).to_contain_text("eval.run", timeout=20_000)
    expect(page.locator("#job-table")).not_to_contain_text("lakeshore.functions.echo")
