"""Bad input gets an error that says what happened, never a 500: JSON nested too deeply,
oversized headers, a Host not in ALLOWED_HOSTS, a body too large."""

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django import forms
from django.conf import settings as django_settings
from django.core.exceptions import SuspiciousOperation
from django.test import RequestFactory

from lakeshore_admin.api_errors import bad_request
from lakeshore_admin.parsers import DepthLimitedJSONFormField, json_depth
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db


def nested(depth: int, leaf=1):
    """`depth` levels of arrays (alternating with objects) around `leaf`, built without
    recursion."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def deep_text(depth: int) -> str:
    return "[" * depth + "]" * depth


# --- JSON nesting --------------------------------------------------------------------------


def test_it_refuses_50_000_levels_of_nesting_with_a_400(operator):
    response = operator.post("/api/v1/jobs/", deep_text(50_000), content_type="application/json")
    assert_error(response, 400, "invalid", says=["JSON nested deeper than 64 levels"])


def test_it_refuses_deep_nesting_inside_an_ordinary_body(operator):
    body = '{"function": "a.b", "args": ' + deep_text(5_000) + "}"
    response = operator.post("/api/v1/jobs/", body, content_type="application/json")
    assert_error(response, 400, "invalid", says=["nested deeper than 64"])


def test_it_refuses_deep_nesting_in_a_batch_and_in_a_patch(operator):
    batch = json.dumps([{"function": "a.b", "args": [nested(70)]}])
    response = operator.post("/api/v1/jobs/", batch, content_type="application/json")
    assert_error(response, 400, "invalid", says=["nested deeper than 64"])

    operator.post("/api/v1/providers/", {"name": "p", "kind": "simulated"}, format="json")
    patch = json.dumps({"config": nested(80)})
    response = operator.patch("/api/v1/providers/p/", patch, content_type="application/json")
    assert_error(response, 400, "invalid", says=["nested deeper than 64"])


def test_it_accepts_exactly_64_levels_and_refuses_65(operator):
    # the body's object is level 1 and args level 2: its one argument adds 62 more
    body = {"function": "lakeshore.functions.echo", "args": [nested(62)]}
    assert json_depth(json.dumps(body)) == 64
    response = operator.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["args"] == [nested(62)]

    body = {"function": "lakeshore.functions.echo", "args": [nested(63)]}
    response = operator.post("/api/v1/jobs/", body, format="json")
    assert_error(response, 400, "invalid", says=["nested deeper than 64"])


def test_brackets_inside_strings_do_not_count(operator):
    brackets = "[{" * 500 + '\\"' + "[" * 500
    body = '{"function": "lakeshore.functions.echo", "args": ["' + brackets + '"]}'
    response = operator.post("/api/v1/jobs/", body, content_type="application/json")
    assert response.status_code == 201, response.content
    assert response.json()["args"] == [brackets.replace('\\"', '"')]


def test_malformed_json_still_says_parse_error(operator):
    response = operator.post("/api/v1/jobs/", '{"function": [}', content_type="application/json")
    assert_error(response, 400, "invalid", says=["JSON parse error"])


def test_unterminated_deep_json_is_refused_without_a_500(operator):
    response = operator.post("/api/v1/jobs/", "[" * 100_000, content_type="application/json")
    assert_error(response, 400, "invalid", says=["nested deeper than 64"])


def test_the_limit_is_a_setting(operator, settings):
    settings.LAKESHORE_JSON_MAX_DEPTH = 3
    response = operator.post("/api/v1/jobs/", {"function": "a.b", "args": [[[1]]]}, format="json")
    assert_error(response, 400, "invalid", says=["nested deeper than 3 levels"])


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("1", 0),
        ('"[[["', 0),
        ("[]", 1),
        ('{"a": [1, {"b": "]]]{{{"}]}', 3),
        ('["\\\\", ["\\"]"]]', 2),
        ("[[],[[]],[]]", 3),
        ('[true, false, null, -1.5e3, {"x": {}}]', 3),
        (deep_text(100_000), 100_000),
    ],
)
def test_json_depth_counts_brackets_outside_strings(text, depth):
    assert json_depth(text) == depth


def test_json_depth_matches_the_decoded_nesting():
    for depth in range(0, 80, 7):
        assert json_depth(json.dumps(nested(depth))) == depth


# --- oversized headers ---------------------------------------------------------------------


def test_an_oversized_header_gets_a_json_431_under_the_api(operator):
    response = operator.get("/api/v1/queues/", HTTP_X_TRACE="a" * 9000)
    assert response["Content-Type"].startswith("application/json")
    assert_error(response, 431, "too_large", says=["request header fields too large", "X-Trace"])


def test_a_header_at_the_limit_is_fine(operator):
    response = operator.get("/api/v1/queues/", HTTP_X_TRACE="a" * 8190)
    assert response.status_code == 200


def test_headers_over_32_kib_together_get_431(operator):
    headers = {f"HTTP_X_PART_{n}": "a" * 7000 for n in range(5)}
    response = operator.get("/api/v1/queues/", **headers)
    assert_error(response, 431, "too_large", says=["32768"])


def test_more_than_100_headers_get_431(operator):
    headers = {f"HTTP_X_N{n}": "1" for n in range(101)}
    response = operator.get("/api/v1/queues/", **headers)
    assert_error(response, 431, "too_large", says=["header fields"])


def test_an_oversized_header_gets_a_431_page_outside_the_api(client):
    response = client.get("/login/", HTTP_COOKIE="a=" + "b" * 9000)
    assert response.status_code == 431
    assert response["Content-Type"].startswith("text/html")
    assert b"Request Header Fields Too Large" in response.content


def test_the_header_limit_is_a_setting(operator, settings):
    settings.LAKESHORE_MAX_HEADER_BYTES = 2000
    response = operator.get("/api/v1/queues/", HTTP_X_TRACE="a" * 2001)
    assert_error(response, 431, "too_large", says=["2000"])


# --- a bad Host, a body too large, other bad requests --------------------------------------


def test_a_host_not_allowed_says_so_under_the_api(operator):
    response = operator.get("/api/v1/queues/", HTTP_HOST="evil.example")
    error = assert_error(response, 400, "bad_host")
    assert error["message"] == "Host 'evil.example' is not allowed: add it to ALLOWED_HOSTS."


def test_a_host_with_a_port_names_the_name_to_add(operator):
    response = operator.get("/api/v1/queues/", HTTP_HOST="evil.example:8443")
    error = assert_error(response, 400, "bad_host")
    assert "add 'evil.example' to ALLOWED_HOSTS" in error["message"]
    assert "10 MB" not in error["message"]


def test_a_host_not_allowed_gets_an_html_page_elsewhere(client):
    response = client.get("/login/", HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")
    assert b"Host &#x27;evil.example&#x27; is not allowed" in response.content


def test_a_malformed_host_is_called_that_and_escaped(client):
    response = client.get("/login/", HTTP_HOST="<script>x</script>")
    assert response.status_code == 400
    assert b"<script>" not in response.content
    assert b"is not a valid host name" in response.content


def test_a_form_body_over_10_mb_gets_a_413_page(client):
    response = client.post("/login/", {"username": "x" * (11 * 1024 * 1024), "password": "p"})
    assert response.status_code == 413
    assert b"The request body is too large (at most 10 MB)." in response.content


def test_other_bad_requests_say_bad_request():
    factory = RequestFactory()
    response = bad_request(factory.get("/api/v1/queues/"), SuspiciousOperation("odd"))
    assert_error(response, 400, "invalid", says=["Bad request"])
    response = bad_request(factory.get("/jobs/"), SuspiciousOperation("odd"))
    assert response.status_code == 400 and b"Bad Request (400)" in response.content


# --- behind gunicorn: Django's limit answers before the server's -------------------------------

GUNICORN_LIMITS = [
    "--limit-request-line",
    "8190",
    "--limit-request-field_size",
    "16384",
    "--limit-request-fields",
    "128",
]


@pytest.fixture
def gunicorn(tmp_path):
    """Start gunicorn (threads, as in production) on a free port with the given flags."""
    started = []

    def start(*flags: str) -> int:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env["DJANGO_SETTINGS_MODULE"] = "lakeshore_admin.settings_test"
        env["LAKESHORE_VAR_DIR"] = str(tmp_path / "var")
        if django_settings.EMBEDDED_PGDATA is not None:
            env["LAKESHORE_TEST_PGDATA"] = str(django_settings.EMBEDDED_PGDATA)
        command = [
            str(Path(sys.executable).with_name("gunicorn")),
            "lakeshore_admin.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--worker-class",
            "gthread",
            "--threads",
            "2",
            *flags,
        ]
        proc = subprocess.Popen(
            command,
            cwd=Path(__file__).resolve().parents[2],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started.append(proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    return port
            except OSError:
                assert proc.poll() is None, "gunicorn exited"
                time.sleep(0.2)
        raise AssertionError("gunicorn did not answer /healthz")

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(10)


def raw_get(port: int, path: str, headers: dict[str, str]):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        connection.close()


@pytest.mark.slow
def test_behind_gunicorn_with_the_documented_limits_django_answers(gunicorn):
    port = gunicorn(*GUNICORN_LIMITS)
    for headers in (
        {"X-Trace": "a" * 9000},  # one value over 8190
        {"X-Trace": "a" * 16300},  # nearly gunicorn's line limit
        {f"X-Part-{n}": "a" * 7000 for n in range(5)},  # 35 KB together
        {f"X-N{n}": "1" for n in range(120)},  # over 100 fields, under gunicorn's 128
    ):
        status, content_type, body = raw_get(port, "/api/v1/queues/", headers)
        assert (status, content_type) == (431, "application/json"), (status, body[:200])
        assert json.loads(body)["error"]["code"] == "too_large"


@pytest.mark.slow
def test_behind_gunicorn_with_its_defaults_it_answers_itself(gunicorn):
    """Why the limits must be raised: gunicorn's defaults refuse first, in plain text."""
    port = gunicorn()
    status, content_type, body = raw_get(port, "/api/v1/queues/", {"X-Trace": "a" * 9000})
    assert status in (400, 431) and not content_type.startswith("application/json")


def test_the_form_field_refuses_deep_json_as_a_form_error():
    """For Django admin's JSON fields (a RecursionError there today: see the report)."""

    class ConfigForm(forms.Form):
        config = DepthLimitedJSONFormField()

    form = ConfigForm({"config": deep_text(50_000)})
    assert not form.is_valid()
    assert form.errors["config"] == ["JSON nested deeper than 64 levels."]
    assert deep_text(50_000) in form.as_p()  # shown again as typed, without decoding it
    assert ConfigForm({"config": json.dumps(nested(64))}).is_valid()
