"""The console's details in Chromium, at 1280 and 390 px: sparklines, relative times, the
Edit button, links in the events, the queue cards on a phone, the favicon, and what a
keyboard or screen reader user meets (skip link, current page, names, focus kept across
refreshes, pausing them, live regions, control borders, focus after a refused form)."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from fleet.daemons import daemon_drop
from fleet.models import Daemon
from jobs import services as job_services
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.browser]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}


@pytest.fixture
def ops(page, live_server, settings):
    """A superuser's session (operator buttons, admin links); the console's boxes
    refresh every half second, so that a test waits for a refresh briefly."""
    settings.LAKESHORE_CONSOLE_REFRESH_SECONDS = 0.5
    user = get_user_model().objects.create_superuser("ops", "", "a-long-test-password")
    client = Client()
    client.force_login(user)  # the session cookie, without the login form's round trips
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    page.context.add_cookies(
        [{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": live_server.url}]
    )
    # counts the swaps htmx settles, so a test can wait for the next refresh
    page.add_init_script(
        "window.__settled = 0;"
        "document.addEventListener('htmx:afterSettle', () => { window.__settled += 1; });"
    )
    return page


def _go(page, live_server, path: str):
    page.goto(f"{live_server.url}{path}")


def _refreshes(page, count: int = 2):
    """Wait until htmx has settled `count` more swaps (refreshes) on this page."""
    start = page.evaluate("window.__settled")
    # a function, not an expression: Playwright evals expressions, which the CSP forbids
    page.wait_for_function("(n) => window.__settled >= n", arg=start + count, timeout=10_000)


def _box(locator, timeout_ms: int = 5_000) -> dict:
    """Where `locator` is drawn. A refresh swaps a box's content for the new one, and an
    element caught in that swap has no box for a moment, so look again until it has one."""
    page = locator.page
    for _ in range(timeout_ms // 50):
        box = locator.bounding_box()
        if box is not None:
            return box
        page.wait_for_timeout(50)
    raise AssertionError(f"{locator} was never drawn within {timeout_ms} ms")


# ---------------------------------------------------------------------------- sparklines


def test_a_sparkline_is_readable_and_says_each_value_on_hover(ops, live_server, world):
    page = ops
    _go(page, live_server, "/")
    # the dashboard above the table refreshes: nothing may move between a look and a point
    page.get_by_role("button", name="Pause updates").click()
    row = page.locator("#queue-table tbody tr").filter(has_text="training-h100")
    svg = row.locator("svg.sparkline")
    svg.scroll_into_view_if_needed()  # below the dashboard: a point off the screen is no element
    box = _box(svg)
    assert box["height"] >= 30 and box["width"] >= 100  # was 20 × 80 px
    marks = svg.locator("rect.spark-mark")
    assert marks.count() >= 50  # an hour of samples, one a minute
    texts = marks.locator("title").all_text_contents()
    assert all(re.fullmatch(r"\d\d:\d\d — \d+\+? pending", text) for text in texts), texts[:3]
    # what the pointer is over at a point of the line is a sample with its value
    middle = marks.nth(marks.count() // 2)
    mark_box = _box(middle)
    x, y = mark_box["x"] + mark_box["width"] / 2, mark_box["y"] + mark_box["height"] / 2
    page.mouse.move(x, y)
    under = page.evaluate(
        f"document.elementFromPoint({x}, {y}).closest('rect')?.querySelector('title')?.textContent"
    )
    assert under == middle.locator("title").text_content()


# ---------------------------------------------------------------------------- times


def test_a_heartbeat_reads_seconds_with_the_exact_time_on_hover_and_stays_current(ops, live_server):
    page = ops
    daemon = builders.daemon(name="gpu-1", queues=[])
    Daemon.objects.filter(pk=daemon.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=12)
    )
    _go(page, live_server, "/daemons/")
    when = page.locator(f"#daemon-{daemon.pk} td[data-label='Last heartbeat'] time")
    expect(when).to_have_text(re.compile(r"^1[2-4] seconds ago$"))
    expect(when).to_have_attribute("title", re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))
    expect(when).to_have_attribute("datetime", re.compile(r"^\d{4}-\d\d-\d\dT"))
    first = int(when.text_content().split()[0])
    page.wait_for_timeout(1_500)
    _refreshes(page)
    assert int(when.text_content().split()[0]) > first  # the refresh keeps it current


# ---------------------------------------------------------------------------- Edit


def test_edit_is_a_button_like_its_neighbours_and_still_a_link(ops, live_server, world):
    page = ops
    _go(page, live_server, f"/queues/{world['queue']}/")
    # no refresh may swap the buttons between a focus and its read
    pause = page.get_by_role("button", name="Pause updates")
    pause.click()
    expect(pause).to_have_attribute("aria-pressed", "true")
    page.wait_for_timeout(200)  # a refresh already on its way
    edit = page.get_by_role("link", name="Edit queue training-h100")
    drain = page.get_by_role("button", name="Drain queue training-h100")
    look = (
        "el => { const s = getComputedStyle(el); return [s.borderTopWidth, s.borderTopStyle,"
        " s.borderTopColor, s.borderRadius, s.paddingTop, s.paddingLeft, s.fontSize,"
        " s.backgroundColor, s.textDecorationLine, el.getBoundingClientRect().height]; }"
    )
    assert edit.evaluate(look) == drain.evaluate(look)
    # the same focus ring, from the keyboard
    ring = (
        "el => { const s = getComputedStyle(el);"
        " return [s.outlineStyle, s.outlineWidth, s.outlineColor]; }"
    )
    page.keyboard.press("Tab")  # something focused, then move to each by keyboard
    edit.focus()
    edit_ring = edit.evaluate(ring)
    drain.focus()
    assert edit_ring == drain.evaluate(ring) and edit_ring[0] == "solid"
    edit.click()
    page.wait_for_url(f"{live_server.url}/queues/training-h100/edit/")


# ---------------------------------------------------------------------------- events


def test_the_events_link_the_job_and_the_daemon_they_name(ops, live_server):
    page = ops
    builders.queue(name="train")
    job, _ = job_services.invocation_submit(function="a.b", queue="train")
    job_services.invocation_kill(invocation_id=job.pk)
    daemon = builders.daemon(name="gpu-7", queues=["train"])
    daemon_drop(daemon=daemon)
    _go(page, live_server, "/events/")
    table = page.locator("#event-table")
    expect(table.get_by_role("link", name=f"job {job.pk}")).to_have_attribute(
        "href", f"/jobs/{job.pk}/"
    )
    expect(table.get_by_role("link", name=f"daemon {daemon.pk}")).to_have_attribute(
        "href", f"/daemons/?id={daemon.pk}"
    )
    expect(table.get_by_role("link", name="gpu-7")).to_have_attribute(
        "href", f"/daemons/?id={daemon.pk}"
    )
    table.get_by_role("link", name=f"job {job.pk}").click()
    page.wait_for_url(f"{live_server.url}/jobs/{job.pk}/")
    # the queue page's timeline too
    _go(page, live_server, "/queues/train/")
    expect(page.get_by_role("link", name=f"job {job.pk}")).to_have_count(1)


# ---------------------------------------------------------------------------- phones


def test_the_queue_list_is_cards_on_a_phone_and_a_table_on_a_desktop(ops, live_server, world):
    page = ops
    page.set_viewport_size(PHONE)
    _go(page, live_server, "/")
    # the table refreshes itself: nothing may move between a look and a measure
    page.get_by_role("button", name="Pause updates").click()
    expect(page.locator("#queue-table thead")).to_be_hidden()
    row = page.locator("#queue-table tbody tr").filter(has_text="training-h100")
    box = _box(row)
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    for label in ("Name", "Pending", "Last hour", "Busy / idle", "Provider", "Description"):
        cell = row.locator(f"td[data-label='{label}']")
        expect(cell).to_be_visible()
        cell_box = _box(cell)
        assert cell_box["x"] + cell_box["width"] <= PHONE["width"], label
    assert (
        row.locator("td[data-label='Last hour']").evaluate(
            "td => getComputedStyle(td, '::before').content"
        )
        == '"Last hour"'
    )
    page.set_viewport_size(DESKTOP)
    expect(page.locator("#queue-table thead")).to_be_visible()


# ---------------------------------------------------------------------------- favicon


def test_the_favicon_is_served_and_no_page_asks_for_what_is_missing(page, live_server):
    missing = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    page.goto(f"{live_server.url}/login/")
    icon = page.locator("link[rel=icon]")
    expect(icon).to_have_attribute("type", "image/svg+xml")
    href = icon.get_attribute("href")
    answer = page.request.get(f"{live_server.url}{href}")
    assert answer.status == 200 and answer.headers["content-type"].startswith("image/svg+xml")
    old = page.request.get(f"{live_server.url}/favicon.ico")  # follows the redirect
    assert old.status == 200 and old.url.endswith(href)
    assert old.body() == answer.body()
    assert missing == []
    gone = page.request.get(f"{live_server.url}/favicon-nope.ico")
    assert gone.status == 404  # the control: a missing file is still a 404


# ---------------------------------------------------------------------------- keyboard


@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["1280", "390"])
def test_the_skip_link_comes_first_and_the_nav_says_where_you_are(ops, live_server, size):
    page = ops
    page.set_viewport_size(size)
    _go(page, live_server, "/jobs/")
    page.keyboard.press("Tab")
    skip = page.locator(":focus")
    expect(skip).to_have_text("Skip to content")
    assert skip.bounding_box()["y"] >= 0  # seen once focused
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "content"
    nav = page.locator("header nav")
    expect(nav.get_by_role("link", name="Jobs")).to_have_attribute("aria-current", "page")
    expect(nav.locator("[aria-current]")).to_have_count(1)
    job, _ = job_services.invocation_submit(function="a.b")
    _go(page, live_server, f"/jobs/{job.pk}/")  # a page below Jobs
    expect(nav.get_by_role("link", name="Jobs")).to_have_attribute("aria-current", "true")
    _go(page, live_server, "/daemons/")
    expect(nav.get_by_role("link", name="Daemons")).to_have_attribute("aria-current", "page")
    expect(nav.get_by_role("link", name="Jobs")).not_to_have_attribute("aria-current", "page")


NAMES_JS = """() => [...document.querySelectorAll('a[aria-label], button[aria-label]')]
  .map((el) => [el.getAttribute('aria-label'), el.innerText.trim()])
  .filter(([, text]) => /[A-Za-z0-9]/.test(text))"""


def test_every_name_starts_with_what_the_control_shows(ops, live_server, world):
    """WCAG 2.5.3: a voice user says what they see."""
    page = ops
    builders.queue(name="gpu")
    job, _ = job_services.invocation_submit(function="a.b", queue="gpu")
    daemon = builders.daemon(name="gpu-1", queues=["gpu"])
    builders.claim(daemon=daemon)
    job_services.invocation_submit(function="a.b", queue="gpu")
    wrong = []
    for path in ("/", f"/queues/{world['queue']}/", "/jobs/?queue=gpu", f"/jobs/{job.pk}/",
                 "/daemons/", "/tokens/"):  # fmt: skip
        _go(page, live_server, path)
        for label, text in page.evaluate(NAMES_JS):
            if not (label.startswith(text) or (text.isdigit() and text in label)):
                wrong.append((path, label, text))
    assert not wrong, wrong
    _go(page, live_server, "/jobs/?queue=gpu")
    expect(page.get_by_role("button", name="Cancel 1 queued in gpu")).to_be_visible()
    _go(page, live_server, f"/jobs/{job.pk}/")
    stop = page.get_by_role("button", name=f"Stop on daemon {daemon.pk}")
    expect(stop).to_have_text(f"Stop on daemon {daemon.pk}")


@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["1280", "390"])
def test_a_refresh_keeps_the_focus_where_it_was(ops, live_server, world, size):
    page = ops
    page.set_viewport_size(size)
    builders.daemon(name="gpu-9", queues=["training-h100"])
    cases = [
        ("/", "#queue-table a[href='/queues/eval/']"),
        ("/jobs/", f"#job-table a[href='/jobs/{world['failed']}/'] >> nth=0"),
        ("/daemons/", "#daemon-table a[href='/queues/training-h100/'] >> nth=1"),
        (f"/queues/{world['queue']}/", "#queue-edit"),
    ]
    for path, selector in cases:
        _go(page, live_server, path)
        link = page.locator(selector)
        link.focus()
        link.evaluate("el => { el.dataset.old = 'yes'; }")  # only the old element has it
        # the next refresh replaced it; then htmx settles (20 ms) and console.js acts
        page.wait_for_function("() => !document.querySelector('[data-old]')", timeout=10_000)
        # look until console.js has put it back (a loaded machine settles late), or 5 s
        for _ in range(100):
            focused = page.evaluate(
                "[document.activeElement.tagName, document.activeElement.getAttribute('href')]"
            )
            if focused[0] != "BODY":
                break
            page.wait_for_timeout(50)
        assert focused == ["A", link.get_attribute("href")], (path, focused)


def test_a_refresh_without_the_focus_kept_would_drop_it(ops, live_server, world):
    """The control for the test above: without console.js's note, the focus falls to
    <body> at a refresh (htmx keeps it only for elements with an id)."""
    page = ops
    page.route("**/static/js/console.js", lambda route: route.fulfill(body="", status=200))
    _go(page, live_server, "/")
    page.locator("#queue-table a[href='/queues/eval/']").focus()
    _refreshes(page)
    assert page.evaluate("document.activeElement.tagName") == "BODY"


def _requests_during(page, seconds: float) -> int:
    sent = []

    def listener(request):
        sent.append(request.url)

    page.on("request", listener)
    page.wait_for_timeout(seconds * 1000)
    page.remove_listener("request", listener)
    return len(sent)


def test_pause_updates_stops_the_refreshes_in_this_tab(ops, live_server, world):
    page = ops
    _go(page, live_server, "/daemons/")
    pause = page.get_by_role("button", name="Pause updates")
    expect(pause).to_have_attribute("aria-pressed", "false")
    assert _requests_during(page, 1.2) >= 1  # the control: it refreshes
    pause.click()
    expect(pause).to_have_attribute("aria-pressed", "true")
    page.wait_for_timeout(200)  # a request already on its way
    assert _requests_during(page, 1.2) == 0
    _go(page, live_server, f"/queues/{world['queue']}/")  # another page of this tab
    expect(pause).to_have_attribute("aria-pressed", "true")
    assert _requests_during(page, 1.2) == 0
    pause.click()
    expect(pause).to_have_attribute("aria-pressed", "false")
    assert _requests_during(page, 1.2) >= 1
    # a page where nothing refreshes has no such button
    _go(page, live_server, "/events/")
    expect(pause).to_be_hidden()


def test_a_list_error_is_announced_once_not_at_every_refresh(ops, live_server):
    page = ops
    _go(page, live_server, "/jobs/?since=soon")
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("since")
    page.evaluate(
        """() => { window.__alerts = 0;
        new MutationObserver((changes) => { window.__alerts += changes.length; })
          .observe(document.getElementById('job-table-alert'),
                   {childList: true, subtree: true, characterData: true}); }"""
    )
    _refreshes(page)
    assert page.evaluate("window.__alerts") == 0
    assert page.locator("#job-table [role=alert]").count() == 0  # none in what refreshes
    page.fill("input[name=since]", "")  # a valid filter now: the region says nothing
    page.locator("form.filters button[type=submit]").click()
    expect(page.locator("#job-table-alert")).to_be_empty()
    assert page.evaluate("window.__alerts") > 0


# ---------------------------------------------------------------------------- forms

CONTRAST_JS = """(el) => {
  const rgb = (c) => c.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const lum = (c) => { const [r, g, b] = rgb(c).map((v) => { v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p);
    return (x + 0.05) / (y + 0.05); };
  let back = el.parentElement;
  while (getComputedStyle(back).backgroundColor === 'rgba(0, 0, 0, 0)') back = back.parentElement;
  const border = getComputedStyle(el).borderTopColor;
  return [ratio(border, getComputedStyle(back).backgroundColor),
          ratio(border, getComputedStyle(document.body).backgroundColor)];
}"""


def test_inputs_and_selects_have_borders_of_3_to_1_in_light_and_dark(ops, live_server):
    page = ops
    _go(page, live_server, "/queues/add/")
    controls = page.locator("form.queue-form input:not([type=hidden]), form.queue-form select")
    assert controls.count() >= 5
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for i in range(controls.count()):
            control = controls.nth(i)
            ratios = control.evaluate(CONTRAST_JS)
            assert min(ratios) >= 3, (scheme, control.get_attribute("name"), ratios)


@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["1280", "390"])
def test_a_refused_form_puts_the_focus_on_the_first_invalid_field(ops, live_server, size):
    page = ops
    page.set_viewport_size(size)
    _go(page, live_server, "/queues/add/")
    page.fill("#id_name", "Not A Name!")
    page.fill("#id_max_depth", "-3")
    page.locator("form.queue-form button[type=submit]").click()
    expect(page.locator("#id_name")).to_be_focused()
    name = page.locator("#id_name")
    expect(name).to_have_attribute("aria-invalid", "true")
    described = name.get_attribute("aria-describedby").split()
    assert "id_name_error" in described
    expect(page.locator("#id_name_error")).to_contain_text("lower-case letters")
    # the control: a form sent right is not held, nothing invalid to focus
    page.fill("#id_name", "good-name")
    page.fill("#id_max_depth", "")
    page.locator("form.queue-form button[type=submit]").click()
    page.wait_for_url(f"{live_server.url}/queues/good-name/")


# ---------------------------------------------------------------------------- what ended


@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["1280", "390"])
def test_the_dashboard_and_the_queue_page_say_what_ended_and_lead_to_the_failures(
    ops, live_server, world, size
):
    page = ops
    page.set_viewport_size(size)
    _go(page, live_server, "/")
    dashboard = page.locator("#dashboard")
    expect(dashboard.get_by_role("heading", name="The fleet, last hour")).to_be_visible()
    expect(dashboard.locator("dl.ended")).to_contain_text("Succeeded")
    for name in ("Jobs that ended per minute on every queue", "How long jobs ran on every queue"):
        chart = dashboard.get_by_role("img", name=re.compile(name))
        expect(chart).to_be_visible()
        box = _box(chart)
        assert box["x"] >= 0 and box["x"] + box["width"] <= size["width"]  # it fits
    _refreshes(page)  # the dashboard refreshes itself
    expect(page.locator("#dashboard")).to_contain_text("The fleet, last hour")
    error = page.locator("#dashboard table.errors a", has_text="CUDA out of memory").first
    error.click()
    page.wait_for_url(re.compile(r"/jobs/\?state=failed&state=timeout&search=RuntimeError"))
    expect(page.locator("#job-table")).to_contain_text("train.loop.step")
    expect(page.get_by_role("button", name=re.compile(r"^Retry 1 shown"))).to_be_visible()

    _go(page, live_server, "/queues/eval/")
    ended = page.locator("#queue-ended")
    expect(ended.get_by_role("heading", name="What ended in the last hour")).to_be_visible()
    expect(ended.locator("dl.ended")).to_contain_text("Succeeded")
    expect(
        ended.get_by_role("img", name=re.compile("How long jobs ran on queue eval"))
    ).to_be_visible()
    expect(ended.locator("table.errors")).to_contain_text("CUDA out of memory")
