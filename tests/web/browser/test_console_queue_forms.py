import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from accounts.roles import grant
from queues.models import Queue
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.browser]


@pytest.fixture
def operator(page, live_server):
    user = get_user_model().objects.create_user("olga", password="a-long-test-password")
    grant(user, "operator")
    page.goto(f"{live_server.url}/")
    page.fill("#id_username", "olga")
    page.fill("#id_password", "a-long-test-password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    return page


def test_an_operator_adds_a_queue_from_the_form_and_lands_on_its_page(operator, live_server):
    page = operator
    builders.provider(name="here")
    page.get_by_role("link", name="New queue").click()
    page.wait_for_url(f"{live_server.url}/queues/add/")

    page.get_by_label("Name", exact=True).fill("Training")  # upper case: refused
    page.get_by_role("button", name="Add queue").click()
    expect(page.get_by_role("alert")).to_contain_text("not saved")
    name = page.get_by_label("Name", exact=True)
    expect(name).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#id_name_error")).to_contain_text("lower-case letters")

    name.fill("training-h100")
    page.get_by_label("Kind").select_option("priority")
    page.get_by_label("Description").fill("h100 prod")
    page.get_by_label("Provider").select_option("here")
    page.get_by_label("Elasticity", exact=True).select_option("pool_with_threshold")
    page.get_by_label("Max daemons").fill("4")
    page.get_by_label("Threshold").fill("0.5")
    page.get_by_label("Max depth").fill("100")
    page.get_by_role("button", name="Add queue").click()

    page.wait_for_url(f"{live_server.url}/queues/training-h100/")
    expect(page.locator("#messages")).to_contain_text("Queue 'training-h100' added.")
    expect(page.locator("#queue-summary h1")).to_contain_text("training-h100")
    expect(page.locator("#queue-summary")).to_contain_text("pool-with-threshold 0..4 @0.5")
    queue = Queue.objects.get(name="training-h100")
    assert (queue.kind, queue.provider.name, queue.max_depth) == ("priority", "here", 100)


def test_an_operator_edits_a_queue_from_its_page(operator, live_server):
    page = operator
    builders.queue(name="train", description="old")
    page.goto(f"{live_server.url}/queues/train/")
    page.get_by_role("link", name="Edit queue train").click()
    page.wait_for_url(f"{live_server.url}/queues/train/edit/")
    page.get_by_label("Description").fill("new words")
    page.get_by_role("button", name="Save changes").click()

    page.wait_for_url(f"{live_server.url}/queues/train/")
    expect(page.locator("#messages")).to_contain_text("saved (description)")
    expect(page.locator("#queue-summary")).to_contain_text("new words")
