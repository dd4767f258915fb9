"""Accessibility of every console page in Chromium: axe-core (the copy bundled by
axe-playwright-python) at WCAG 2.1 A and AA plus best practice, in light and dark mode,
finds nothing; and at 390 px nothing scrolls sideways, the page or a box in it."""

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth import get_user_model

from tests.web.browser.test_console_tour import _pages  # `world`: tests/web/browser/conftest.py

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.browser]

AXE_OPTIONS = {
    "runOnly": {
        "type": "tag",
        "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"],
    },
    "resultTypes": ["violations"],
}

# How wide the page and each box in it are, against the viewport: a box that scrolls
# sideways by itself (a table in an overflow box) counts too.
SIDEWAYS_JS = """() => {
  const page = document.scrollingElement;
  const boxes = [...document.querySelectorAll("main *")].filter((el) => {
    const o = getComputedStyle(el).overflowX;
    return (o === "auto" || o === "scroll") && el.scrollWidth > el.clientWidth + 1;
  }).map((el) => `${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}.${el.className}` +
                 ` (${el.scrollWidth} > ${el.clientWidth})`);
  return {scroll: page.scrollWidth, width: page.clientWidth, boxes};
}"""


def _readable(violations: list[dict]) -> str:
    """axe's violations as lines a person reads: rule, impact, what, where."""
    lines = []
    for v in violations:
        lines.append(f"{v['id']} ({v['impact']}): {v['help']} <{v['helpUrl']}>")
        for node in v["nodes"][:5]:
            lines.append(f"    at {', '.join(map(str, node['target']))}")
            lines.append(f"       {node['failureSummary'].replace(chr(10), ' / ')}")
    return "\n".join(lines)


def _log_in(page, live_server):
    get_user_model().objects.create_superuser("ops", "", "a-long-test-password")
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "a-long-test-password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/")


def _pages_with_a_refused_form(world) -> dict[str, str]:
    return {"login": "/login/", **_pages(world)}


def test_axe_finds_nothing_on_any_page_in_light_and_dark(page, live_server, world):
    axe = Axe()
    found = {}
    pages = _pages_with_a_refused_form(world)
    page.set_viewport_size({"width": 1280, "height": 900})
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        page.goto(f"{live_server.url}/login/")
        results = axe.run(page, options=AXE_OPTIONS).response
        if results["violations"]:
            found[("login", scheme)] = _readable(results["violations"])
    _log_in(page, live_server)
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for name, url in pages.items():
            if name == "login":
                continue
            page.goto(f"{live_server.url}{url}")
            results = axe.run(page, options=AXE_OPTIONS).response
            if results["violations"]:
                found[(name, scheme)] = _readable(results["violations"])
        # a form refused by the server: its errors at the fields
        page.goto(f"{live_server.url}/queues/add/")
        page.fill("#id_name", "Not A Name!")
        page.click("form.queue-form button[type=submit]")
        page.wait_for_selector("[aria-invalid=true]")
        results = axe.run(page, options=AXE_OPTIONS).response
        if results["violations"]:
            found[("queue-add refused", scheme)] = _readable(results["violations"])
    report = [f"{name} ({scheme}):\n{text}" for (name, scheme), text in found.items()]
    assert not found, "\n\n".join(report)


def test_axe_sees_a_violation_when_there_is_one(page, live_server):
    """The negative control: the same run reports an image without a name."""
    page.goto(f"{live_server.url}/login/")
    page.evaluate("document.querySelector('main').insertAdjacentHTML('beforeend', '<img src=x>')")
    results = Axe().run(page, options=AXE_OPTIONS).response
    assert "image-alt" in {v["id"] for v in results["violations"]}


def test_nothing_scrolls_sideways_at_390_px(page, live_server, world):
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{live_server.url}/login/")
    wide = {}
    fit = page.evaluate(SIDEWAYS_JS)
    if fit["scroll"] > fit["width"] or fit["boxes"]:
        wide["login"] = fit
    _log_in(page, live_server)
    for name, url in _pages(world).items():
        page.goto(f"{live_server.url}{url}")
        fit = page.evaluate(SIDEWAYS_JS)
        if fit["scroll"] > fit["width"] or fit["boxes"]:
            wide[name] = fit
    assert not wide, wide
    # the negative control: a box wider than the phone is seen
    page.evaluate(
        "document.querySelector('main').insertAdjacentHTML('beforeend',"
        " '<div class=table-box><table><tr><td>' + 'x'.repeat(400) + '</td></tr></table></div>')"
    )
    fit = page.evaluate(SIDEWAYS_JS)
    assert fit["boxes"]
