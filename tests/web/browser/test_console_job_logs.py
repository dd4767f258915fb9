"""A running job's output in Chromium: new lines come into the page by themselves; a
reader who scrolled up keeps their place (and their focus), one at the end stays at
the end."""

import pytest
from playwright.sync_api import expect

from tests.support.job_logs import lines, running_job, ship
from tests.web.browser.test_console_job_page import _login

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.browser]

AT_END = "b => b.scrollHeight - b.scrollTop - b.clientHeight < 24"


def test_the_log_tails_a_running_job_and_keeps_the_readers_place(page, live_server):
    job, me, daemon = running_job()
    ship(daemon, me, job, lines(200))
    _login(page, live_server, "viewer", f"/jobs/{job}/")
    box = page.locator("#job-log")
    expect(box).to_contain_text("line 199")
    assert box.evaluate(AT_END), "the log opens at its end"

    # a reader scrolls up to read, with the download link focused
    box.evaluate("b => { b.scrollTop = 0; }")
    link = page.get_by_role("link", name="Download attempt 1's log")
    link.focus()
    ship(daemon, me, job, lines(5, start=200), seq=1)
    expect(box).to_contain_text("line 204", timeout=10_000)
    assert box.evaluate("b => b.scrollTop") == 0, "the new lines moved the reader"
    assert page.evaluate("document.activeElement.textContent") == link.text_content()

    # at the end, the reader follows the new lines
    box.evaluate("b => { b.scrollTop = b.scrollHeight; }")
    ship(daemon, me, job, lines(40, start=205), seq=2)
    expect(box).to_contain_text("line 244", timeout=10_000)
    page.wait_for_function(f"() => ({AT_END})(document.querySelector('#job-log'))")
    expect(box.locator(".line")).to_have_count(245)  # every line once
