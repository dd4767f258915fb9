"""Under the Content-Security-Policy, Chromium reports no violation on the console's
pages or Django admin's, before and after htmx swaps content in."""

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.browser]

# Registered before any page script runs; Playwright's init scripts are not subject to CSP.
LISTEN = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  const where = `${e.sourceFile}:${e.lineNumber}`;
  window.__violations.push(`${e.violatedDirective} ${e.blockedURI} ${where}`);
});
"""


@pytest.fixture
def watched(page, live_server):
    """A logged-in staff user's page that records CSP violations and console errors."""
    reports: list[str] = []
    page.add_init_script(LISTEN)
    page.on(
        "console",
        lambda msg: (
            reports.append(msg.text)
            if msg.type == "error" or "Content Security Policy" in msg.text
            else None
        ),
    )
    get_user_model().objects.create_superuser("root", "", "a-long-test-password")
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "a-long-test-password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/")

    def violations() -> list[str]:
        return page.evaluate("window.__violations") + [r for r in reports if "olicy" in r]

    page.violations = violations
    return page


def test_the_console_pages_break_no_rule(watched, live_server):
    builders.queue(name="training-h100")
    builders.daemon(queues=["training-h100"])
    for url in ("/", "/jobs/", "/daemons/", "/queues/training-h100/"):
        watched.goto(f"{live_server.url}{url}")
        watched.wait_for_load_state("networkidle")
        assert watched.evaluate("typeof htmx") == "object", url
        assert watched.violations() == [], url


def test_htmx_swaps_break_no_rule(watched, live_server):
    builders.queue(name="training-h100")
    watched.goto(f"{live_server.url}/")
    watched.select_option("select[name=state]", "archived")
    expect(watched.locator("#queue-table")).not_to_contain_text("training-h100")
    assert watched.violations() == []

    watched.goto(f"{live_server.url}/queues/training-h100/")
    watched.on("dialog", lambda dialog: dialog.accept())  # "Drain queue …?"
    watched.get_by_role("button", name="Drain queue training-h100").click()
    expect(watched.locator("#queue-summary .state")).to_have_text("draining")
    expect(watched.get_by_role("status")).to_contain_text("drain done")
    assert watched.violations() == []

    for page in ("/jobs/", "/daemons/", "/events/", "/queues/add/", "/jobs/424242/"):
        watched.goto(f"{live_server.url}{page}")
        watched.wait_for_load_state("networkidle")
    assert watched.violations() == []


def test_django_admin_breaks_no_rule(watched, live_server):
    builders.queue(name="training-h100")
    for url in ("/admin/", "/admin/queues/queue/", "/admin/queues/queue/add/"):
        watched.goto(f"{live_server.url}{url}")
        watched.wait_for_load_state("networkidle")
        assert watched.violations() == [], url
    # admin's own scripts ran: the changelist's select-all box works
    watched.goto(f"{live_server.url}/admin/queues/queue/")
    watched.check("#action-toggle")
    expect(watched.locator("input.action-select").first).to_be_checked()
    assert watched.violations() == []


def test_a_violation_would_be_seen(watched, live_server):
    """The negative control: an inline script, which the policy refuses, is reported."""
    watched.goto(f"{live_server.url}/")
    watched.evaluate(
        "() => { const s = document.createElement('script');"
        " s.textContent = 'window.__ran = 1'; document.body.appendChild(s); }"
    )
    watched.wait_for_timeout(200)
    assert watched.evaluate("window.__ran") is None
    assert any("script-src" in v for v in watched.violations())
