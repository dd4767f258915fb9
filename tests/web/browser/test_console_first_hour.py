"""What a newcomer tripped over on the console, seen in Chromium at 1280 and 390 px: a
token's prefix on one line, no empty box above "It printed nothing.", the queue form's
fields in one column with Runner a choice, cards whose labels and values read from the
left with a state pill its own width, each queue's succeeded count, an event that names
the manage.py command; and axe finds nothing on those pages at either width."""

from datetime import timedelta

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.core.management import call_command
from django.utils import timezone
from playwright.sync_api import expect

from jobs.models import Invocation
from tests.web.browser.test_console_a11y import AXE_OPTIONS, _log_in, _readable

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.browser]

SIZES = {"1280": {"width": 1280, "height": 900}, "390": {"width": 390, "height": 844}}


@pytest.fixture
def newcomer(world):
    """The tour's system, a token made with manage.py, and an SDK job that printed
    nothing."""
    call_command("create_token", user="ml-team", role="daemon", name="first worker")
    now = timezone.now()
    quiet = Invocation.objects.create(
        queue="eval", function="demo.quiet", state="succeeded", wire="envelope", attempts=1
    )
    Invocation.objects.filter(pk=quiet.pk).update(
        started_at=now - timedelta(seconds=2), finished_at=now
    )
    return {**world, "quiet": quiet.pk}


def _left(locator) -> float:
    return locator.bounding_box()["x"]


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_the_first_hour_on_the_console(page, live_server, newcomer, size):
    page.set_viewport_size(size)
    phone = size["width"] < 600
    _log_in(page, live_server)
    axe, found = Axe(), {}

    def look(path: str) -> None:
        page.goto(f"{live_server.url}{path}")
        violations = axe.run(page, options=AXE_OPTIONS).response["violations"]
        if violations:
            found[path] = _readable(violations)

    # a token's prefix stays on one line
    look("/tokens/")
    prefix = page.locator("td[data-label='Starts with'] code").first
    expect(prefix).to_be_visible()
    line = prefix.evaluate("el => parseFloat(getComputedStyle(el).lineHeight) || 20")
    assert prefix.bounding_box()["height"] < 1.5 * line  # one line, not two

    # an SDK job that printed nothing says so, with no empty box above it
    look(f"/jobs/{newcomer['quiet']}/")
    expect(page.get_by_text("It printed nothing.")).to_be_visible()
    expect(page.locator("#job-output pre.log")).to_have_count(0)

    # the queue form: Runner is a choice, and the fields line up from group to group
    look("/queues/add/")
    runner = page.locator("#id_runner")
    assert runner.evaluate("el => el.tagName") == "SELECT"
    options = runner.locator("option").evaluate_all("els => els.map((o) => o.value)")
    assert {"pool", "process"} <= set(options)
    fields = ["#id_name", "#id_description", "#id_instance_type", "#id_image_id", "#id_runner"]
    lefts = {name: _left(page.locator(name)) for name in fields}
    assert max(lefts.values()) - min(lefts.values()) <= 1, lefts
    nested = page.locator("fieldset fieldset")
    expect(nested).to_have_count(0)  # no border inside a border

    # the queue list: what each queue finished in the last hour
    look("/")
    row = page.locator("#queue-table tbody tr").filter(has_text="eval")
    succeeded = row.locator("td[data-label='Succeeded 1 h']")
    expect(succeeded).to_have_text("6")  # the tour's five, and the quiet one
    if not phone:
        expect(page.locator("#queue-table thead")).to_contain_text("Succeeded 1 h")

    # cards on a phone: labels and values read from the left; a pill keeps its width
    look("/jobs/")
    cell = page.locator("#job-table td[data-label='State']").first
    pill = cell.locator("span.state")
    if phone:
        aligns = (
            page.locator("#job-table tbody tr")
            .first.locator("td")
            .evaluate_all(
                "tds => tds.filter((td) => td.offsetParent)"
                ".map((td) => getComputedStyle(td).textAlign)"
            )
        )
        assert set(aligns) == {"left"}, aligns
        assert pill.bounding_box()["width"] < 0.5 * cell.bounding_box()["width"]

    # the event of a token made on the server names the command, not "system via system"
    look("/events/")
    expect(page.get_by_text("manage.py create_token").first).to_be_visible()
    expect(page.get_by_text("system via system")).to_have_count(0)  # the system, once

    report = [f"{path}:\n{text}" for path, text in found.items()]
    assert not found, "\n\n".join(report)
