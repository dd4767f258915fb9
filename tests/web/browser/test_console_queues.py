import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from accounts.roles import grant
from queues.models import Queue
from queues.services import queue_transition
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.browser]


@pytest.fixture
def logged_in(page, live_server):
    user = get_user_model().objects.create_user("alice", password="a-long-test-password")
    grant(user, "viewer")  # the console needs a role (tests/web/test_console_roles.py)
    page.goto(f"{live_server.url}/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "a-long-test-password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    return page


def test_the_queue_list_filters_by_state_without_a_reload(logged_in, live_server):
    page = logged_in
    builders.queue(name="training-h100", description="h100 prod")
    builders.queue(name="retired-queue")
    queue_transition(name="retired-queue", action="archive")
    page.reload()
    table = page.locator("#queue-table")
    expect(table).to_contain_text("training-h100")
    expect(table).not_to_contain_text("retired-queue")

    page.evaluate("window.__marker = 'same page'")  # survives only if nothing reloads
    page.select_option("select[name=state]", "archived")
    expect(table).to_contain_text("retired-queue")
    expect(table).not_to_contain_text("training-h100")
    assert page.evaluate("window.__marker") == "same page"
    assert page.url.endswith("/?state=archived")


def test_htmx_comes_from_this_server(logged_in, live_server):
    sources = logged_in.eval_on_selector_all("script[src]", "els => els.map(e => e.src)")
    assert sources and all(src.startswith(live_server.url) for src in sources)
    assert logged_in.evaluate("typeof htmx") == "object"


def test_an_operator_drains_a_queue_from_its_page(page, live_server):
    get_user_model().objects.create_superuser("root", "", "a-long-test-password")
    builders.queue(name="training-h100")
    page.goto(f"{live_server.url}/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "a-long-test-password")
    page.click("input[type=submit]")
    page.click("text=training-h100")
    page.wait_for_url(f"{live_server.url}/queues/training-h100/")
    page.evaluate("window.__marker = 'same page'")
    asked = []
    page.on("dialog", lambda dialog: asked.append(dialog.message) or dialog.accept())
    page.get_by_role("button", name="Drain queue training-h100").click()
    expect(page.locator("#queue-summary .state")).to_have_text("draining")
    assert asked == [
        "Drain queue training-h100? This will stop admitting new work; what is queued and "
        "running still finishes."
    ]
    assert page.evaluate("window.__marker") == "same page"
    assert Queue.objects.get(name="training-h100").state == "draining"
    status = page.get_by_role("status")
    expect(status).to_contain_text("Queue training-h100: drain done; it is draining now.")
    # only what the state allows is offered: a draining queue cannot be paused
    expect(page.get_by_role("button", name="Pause queue training-h100")).to_have_count(0)
    page.get_by_role("button", name="Resume queue training-h100").click()
    expect(page.locator("#queue-summary .state")).to_have_text("active")
    # a change made elsewhere meanwhile: the refusal is said, and earlier messages stay
    queue_transition(name="training-h100", action="archive")
    page.get_by_role("button", name="Pause queue training-h100").click()
    expect(status).to_contain_text(
        "Queue training-h100 was not changed: Cannot pause queue 'training-h100': it is "
        "archived; unarchive it first"
    )
    expect(status).to_contain_text("drain done")
    expect(page.locator("#queue-summary .state")).to_have_text("archived")
