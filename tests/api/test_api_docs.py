"""/api/schema/, /api/docs/ (Swagger UI) and /api/redoc/ (ReDoc): served from this server
alone (drf-spectacular-sidecar), for logged-in readers unless LAKESHORE_PUBLIC_DOCS=1."""

import re
import runpy
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from playwright.sync_api import expect

from accounts.roles import grant
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

PAGES = ["/api/docs/", "/api/redoc/"]
JSON = {"HTTP_ACCEPT": "application/json"}


class Links(HTMLParser):
    """Every src= and href= of a page."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


def links(html: str) -> list[str]:
    parser = Links()
    parser.feed(html)
    return parser.urls


def session(client, role: str | None):
    user = get_user_model().objects.create_user(f"{role or 'nobody'}-reader", password="pw-x")
    if role:
        grant(user, role)
    client.force_login(user)
    return client


def docs_assets(client) -> dict[str, list[str]]:
    """Each docs page (and Swagger UI's start script) with the URLs it loads."""
    pages = {url: client.get(url) for url in [*PAGES, "/api/docs/?script="]}
    for url, response in pages.items():
        assert response.status_code == 200, (url, response.status_code)
    return {url: response.content.decode() for url, response in pages.items()}


@pytest.fixture
def public(settings):
    settings.LAKESHORE_PUBLIC_DOCS = True


# --- who may read them --------------------------------------------------------------------


@pytest.mark.parametrize("url", PAGES)
def test_a_visitor_is_sent_to_log_in_and_back(client, url):
    response = client.get(url, HTTP_ACCEPT="text/html")
    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={url}"


def test_an_anonymous_api_client_gets_401_for_the_schema(api):
    response = api.get("/api/schema/", **JSON)

    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_a_logged_in_reader_gets_the_pages_and_the_schema(client, role):
    reader = session(client, role)
    for url in PAGES:
        response = reader.get(url)
        assert response.status_code == 200 and response["Content-Type"].startswith("text/html")
    schema = reader.get("/api/schema/", {"format": "json"})
    assert schema.status_code == 200 and "/api/v1/queues/" in schema.json()["paths"]


def test_a_logged_in_user_without_a_role_is_told_what_it_needs(client):
    nobody = session(client, None)
    for url in PAGES:
        response = nobody.get(url)
        assert response.status_code == 403
        assert "--role viewer" in response.content.decode()
    assert_error(nobody.get("/api/schema/", **JSON), 403, "permission_denied", says="viewer")


def test_a_bearer_token_with_a_read_role_reads_them(api):
    api.credentials(**builders.auth(builders.token("viewer")))
    assert api.get("/api/schema/", **JSON).status_code == 200
    for url in PAGES:
        assert api.get(url).status_code == 200


def test_a_daemon_token_or_a_bad_token_does_not(api):
    api.credentials(**builders.auth(builders.token("daemon")))
    assert_error(api.get("/api/schema/", **JSON), 403, "permission_denied")
    assert api.get("/api/docs/").status_code == 403
    api.credentials(**builders.auth("lsk_not-a-real-token"))
    assert_error(api.get("/api/schema/", **JSON), 401, "authentication_failed")
    assert api.get("/api/docs/").status_code == 401


def test_the_public_switch_opens_them_to_anyone(api, public):
    for url in PAGES:
        assert api.get(url).status_code == 200
    response = api.get("/api/schema/", **JSON)
    assert response.status_code == 200 and response.json()["openapi"].startswith("3.")


@pytest.mark.django_db(False)
def test_the_public_switch_is_off_unless_the_environment_turns_it_on(monkeypatch, tmp_path):
    def load(**env):
        monkeypatch.setenv("DATABASE_URL", "postgres://u@127.0.0.1:1/none")  # parsed only
        monkeypatch.setenv("LAKESHORE_VAR_DIR", str(tmp_path))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        path = Path(settings.BASE_DIR) / "lakeshore_admin" / "settings.py"
        return runpy.run_path(str(path))["LAKESHORE_PUBLIC_DOCS"]

    monkeypatch.delenv("LAKESHORE_PUBLIC_DOCS", raising=False)
    assert load() is False
    assert load(LAKESHORE_PUBLIC_DOCS="1") is True


# --- nothing from a CDN -------------------------------------------------------------------


def test_the_pages_load_only_local_static_files_that_exist(client, public):
    for url, html in docs_assets(client).items():
        assert not re.search(r"https?://", html), url  # no CDN, no web fonts
        loaded = [u for u in links(html) if not u.startswith("/api/")]
        if url != "/api/docs/?script=":
            assert loaded, url
        for asset in loaded:
            assert asset.startswith("/static/"), (url, asset)
            assert finders.find(asset.split("?")[0].removeprefix("/static/")), asset


def test_swagger_ui_starts_from_a_script_of_this_server(client, public):
    html = client.get("/api/docs/").content.decode()
    assert "<script>" not in html  # no inline script: a strict CSP can allow 'self'
    assert '<script src="/api/docs/?script="></script>' in html
    script = client.get("/api/docs/", {"script": ""})
    assert script["Content-Type"].startswith("application/javascript")
    assert '"/api/schema/"' in script.content.decode()


def test_the_live_server_serves_every_file_the_pages_load(client, public, live_server):
    assets = {a for html in docs_assets(client).values() for a in links(html)}
    static = sorted(a for a in assets if a.startswith("/static/"))
    assert any(a.endswith("swagger-ui-bundle.js") for a in static)
    assert any(a.endswith("redoc.standalone.js") for a in static)
    for asset in static:
        response = httpx.get(f"{live_server.url}{asset}")
        assert response.status_code == 200 and response.content, asset


@pytest.mark.slow
@pytest.mark.browser
def test_both_pages_render_in_a_browser_from_this_server_alone_within_its_csp(
    page, live_server, public
):
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    never_sent = set()  # what the page's Content-Security-Policy stopped in the browser
    page.on("requestfailed", lambda r: never_sent.add(r.url) if r.failure == "csp" else 0)
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Security Policy" in m.text else 0)

    # Both pages parse a megabyte of bundled script before they draw: on a loaded
    # 2-core machine that passed Playwright's 5 s default, so the wait is a reader's
    page.goto(f"{live_server.url}/api/docs/")
    path = page.locator(".opblock-summary-path", has_text="/api/v1/queues/").first
    expect(path).to_be_visible(timeout=30_000)
    page.goto(f"{live_server.url}/api/redoc/")
    expect(page.get_by_text("/api/v1/queues/").first).to_be_attached(timeout=30_000)

    local = (live_server.url, "data:", "blob:")
    assert not [u for u in requested if not u.startswith(local) and u not in never_sent]
    # ReDoc's "API docs by Redocly" footer asks for its logo from its CDN: img-src stops it
    assert not [m for m in refused if not any(u in m for u in never_sent)]
    assert any(u.endswith("redoc.standalone.js") for u in requested)
