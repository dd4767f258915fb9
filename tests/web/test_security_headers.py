"""The console's Content-Security-Policy, and the production switch LAKESHORE_HTTPS
(HSTS, the SSL redirect, secure cookies) that `manage.py check --deploy` asks for."""

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import override_settings

ROOT = Path(__file__).resolve().parents[2]
# Where templates live: the shared ones in templates/, each app's pages in <app>/templates/.
TEMPLATE_FOLDERS = (
    "templates",
    "accounts/templates",
    "jobs/templates",
    "queues/templates",
    "fleet/templates",
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client):
    user = get_user_model().objects.create_superuser("root", "", "pw-for-tests-only")
    client.force_login(user)
    return client


def policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    directives = (part.strip().split() for part in header.split(";") if part.strip())
    return {name: values for name, *values in directives}


# --- Content-Security-Policy -----------------------------------------------------------------


def test_console_pages_send_a_strict_policy(staff):
    response = staff.get("/")
    assert response.status_code == 200
    csp = policy(response)
    assert csp["default-src"] == ["'self'"]
    assert csp["script-src"][0] == "'self'" and csp["script-src"][1].startswith("'nonce-")
    assert csp["style-src"] in (["'self'"], ["'self'", csp["script-src"][1]])
    assert csp["object-src"] == ["'none'"]
    assert csp["base-uri"] == ["'none'"]
    assert csp["frame-ancestors"] == ["'none'"]
    assert csp["form-action"] == ["'self'"]
    assert not any("unsafe" in value for values in csp.values() for value in values)


def test_every_script_tag_carries_this_responses_nonce(staff):
    first, second = staff.get("/"), staff.get("/")
    nonce = policy(first)["script-src"][1].removeprefix("'nonce-").removesuffix("'")
    assert nonce != policy(second)["script-src"][1].removeprefix("'nonce-").removesuffix("'")
    scripts = re.findall(r"<script\b[^>]*>", first.content.decode())
    assert scripts, "htmx should be on the page"
    assert all(f'nonce="{nonce}"' in tag and "src=" in tag for tag in scripts), scripts


def test_htmx_is_told_not_to_inject_styles_or_evaluate_code(staff):
    page = staff.get("/").content.decode()
    meta = re.search(r"<meta name=\"htmx-config\" content='([^']*)'>", page)
    assert meta, "base.html should configure htmx"
    assert json.loads(meta.group(1)) == {
        "includeIndicatorStyles": False,
        "allowEval": False,
        "allowScriptTags": False,
        "historyCacheSize": 0,  # Back reloads: filter inputs match the address
        "refreshOnHistoryMiss": True,
    }


@pytest.mark.parametrize("url", ["/login/", "/admin/login/", "/api/v1/queues/"])
def test_other_pages_get_the_policy_too(client, url):
    response = client.get(url)
    assert "'nonce-" in response["Content-Security-Policy"] or response.status_code != 200
    assert "default-src 'self'" in response["Content-Security-Policy"]


def test_no_template_needs_inline_code_or_styles():
    """What a strict policy refuses: inline event handlers, style attributes, <style>
    and <script> blocks without the nonce, javascript: links, htmx's hx-on (eval)."""
    forbidden = re.compile(
        r"\son[a-z]+\s*=|\sstyle\s*=|<style\b(?![^>]*\bnonce=)"
        r"|<script\b(?![^>]*\b(?:src|nonce)=)|javascript:|hx-on",
        re.IGNORECASE,
    )
    comment = re.compile(r"{#.*?#}|{% comment %}.*?{% endcomment %}", re.DOTALL)
    # templates/api/: the API docs pages, whose views carry a policy of their own (urls.py)
    offenders = [
        f"{path.relative_to(ROOT)}: {match.group(0).strip()}"
        for folder in TEMPLATE_FOLDERS
        for path in (ROOT / folder).rglob("*.html")
        if not path.is_relative_to(ROOT / "templates" / "api")
        for match in forbidden.finditer(comment.sub("", path.read_text()))
    ]
    assert offenders == []


def test_django_admin_pages_work_under_the_policy(staff):
    for url in ("/admin/", "/admin/queues/queue/", "/admin/queues/queue/add/"):
        response = staff.get(url)
        assert response.status_code == 200, url
        page = response.content.decode()
        inline = [tag for tag in re.findall(r"<script\b[^>]*>", page) if "src=" not in tag]
        # a data block (type="application/json") is not run, so the policy allows it
        assert all("application/json" in tag for tag in inline), (url, inline)
        assert not re.search(r"\sstyle\s*=|<style\b|\son[a-z]+\s*=", page), url


# --- LAKESHORE_HTTPS ---------------------------------------------------------------------------


def production_env(tmp_path, **extra) -> dict[str, str]:
    """The test process's environment (so settings attach to the running test database
    server, or the same DATABASE_URL), with production settings and a harmless var dir."""
    unwanted = ("LAKESHORE_HTTPS", "LAKESHORE_HSTS_SECONDS", "DJANGO_ALLOW_ASYNC_UNSAFE")
    env = {k: v for k, v in os.environ.items() if k not in unwanted and not k.startswith("PYTEST")}
    env.update(
        DJANGO_SETTINGS_MODULE="lakeshore_admin.settings",
        LAKESHORE_VAR_DIR=str(tmp_path / "var"),
        LAKESHORE_DEBUG="0",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="lakeshore.example.com",
    )
    if settings.EMBEDDED_PGDATA is not None:
        env["LAKESHORE_PGDATA"] = str(settings.EMBEDDED_PGDATA)
    env.update(extra)
    return env


def read_settings(env: dict[str, str], *names: str) -> dict:
    code = (
        "import json, django; django.setup(); from django.conf import settings; "
        f"print(json.dumps({{n: getattr(settings, n, None) for n in {list(names)!r}}}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


HTTPS_SETTINGS = (
    "SECURE_SSL_REDIRECT",
    "SECURE_REDIRECT_EXEMPT",
    "SECURE_PROXY_SSL_HEADER",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
)


@pytest.mark.slow
def test_the_switch_turns_on_hsts_the_redirect_and_secure_cookies(tmp_path):
    on = read_settings(production_env(tmp_path, LAKESHORE_HTTPS="1"), *HTTPS_SETTINGS)
    assert on["SECURE_SSL_REDIRECT"] and on["SESSION_COOKIE_SECURE"] and on["CSRF_COOKIE_SECURE"]
    assert on["SECURE_HSTS_SECONDS"] == 31536000
    assert on["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]

    off = read_settings(production_env(tmp_path), *HTTPS_SETTINGS)
    assert not off["SECURE_SSL_REDIRECT"] and not off["SESSION_COOKIE_SECURE"]
    assert not off["SECURE_HSTS_SECONDS"] and off["SECURE_PROXY_SSL_HEADER"] is None

    env = production_env(tmp_path, LAKESHORE_HTTPS="1", LAKESHORE_HSTS_SECONDS="600")
    assert read_settings(env, "SECURE_HSTS_SECONDS") == {"SECURE_HSTS_SECONDS": 600}


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_check_deploy_passes_with_the_switch(tmp_path):
    done = check_deploy(production_env(tmp_path, LAKESHORE_HTTPS="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


@pytest.mark.slow
def test_check_deploy_fails_without_the_switch(tmp_path):
    done = check_deploy(production_env(tmp_path))
    assert done.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in done.stderr, done.stderr


@pytest.mark.slow
def test_a_bad_switch_value_names_the_variable(tmp_path):
    env = production_env(tmp_path, LAKESHORE_HTTPS="maybe")
    done = check_deploy(env)
    assert done.returncode != 0 and "LAKESHORE_HTTPS" in done.stderr


HTTPS_ON = {
    "SECURE_SSL_REDIRECT": True,
    "SECURE_REDIRECT_EXEMPT": [r"^healthz$", r"^readyz$"],
    "SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https"),
    "SECURE_HSTS_SECONDS": 31536000,
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
    "SECURE_HSTS_PRELOAD": True,
    "SESSION_COOKIE_SECURE": True,
    "CSRF_COOKIE_SECURE": True,
}


@pytest.mark.slow
def test_the_in_process_copy_matches_the_settings(tmp_path):
    """The tests below run with HTTPS_ON; it must be what LAKESHORE_HTTPS=1 sets."""
    actual = read_settings(production_env(tmp_path, LAKESHORE_HTTPS="1"), *HTTPS_ON)
    assert actual == json.loads(json.dumps(HTTPS_ON))


@override_settings(**HTTPS_ON)
def test_plain_http_is_redirected_but_the_probes_answer(client):
    response = client.get("/login/")
    assert response.status_code == 301
    assert response["Location"] == "https://testserver/login/"
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200


@override_settings(**HTTPS_ON)
def test_https_behind_a_proxy_gets_hsts_and_secure_cookies(client):
    response = client.get("/login/", HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 200
    hsts = response["Strict-Transport-Security"]
    assert hsts == "max-age=31536000; includeSubDomains; preload"
    assert response.cookies["csrftoken"]["secure"]
