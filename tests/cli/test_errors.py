"""How failures reach the user: `error: ...` on stderr, exit 1, never a traceback."""

import socket

import httpx
from click.testing import CliRunner

from lakeshore.cli import cli
from tests.cli.fakes import FakeApi


def test_it_prints_the_servers_message_and_exits_1(fake_api):
    fake_api.on(
        "GET",
        "queues/nope/",
        status=404,
        json={"error": {"code": "not_found", "message": "No queue named 'nope'.", "fields": {}}},
    )
    result = fake_api.run("queues", "show", "nope")
    assert result.exit_code == 1
    assert result.stderr == "error: No queue named 'nope'.\n"
    assert result.stdout == ""


def test_it_names_the_flags_of_invalid_fields(fake_api):
    fields = {
        "elasticity.threshold": "Ensure this value is less than or equal to 1.",
        "max_depth": "Must be at least 1.",
        "on_full": "Not a choice.",
        "elasticity.min": "Must be <= max.",
        "__all__": "Something about the whole.",
    }
    error = {"code": "invalid", "message": "Invalid input.", "fields": fields}
    fake_api.on("POST", "queues/", status=400, json={"error": error})
    result = fake_api.run("queues", "add", "q")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "error: Invalid input.",
        "  --threshold: Ensure this value is less than or equal to 1.",
        "  --max-depth: Must be at least 1.",
        "  --on-full: Not a choice.",
        "  --min: Must be <= max.",
        "  Something about the whole.",
    ]


def test_it_hints_at_login_on_401(fake_api):
    error = {"code": "authentication_failed", "message": "Invalid token.", "fields": {}}
    fake_api.on("GET", "queues/", status=401, json={"error": error})
    result = fake_api.run("queues", "ls")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "error: Invalid token.",
        "hint: run 'lakeshore auth login' or set LAKESHORE_TOKEN",
    ]


def test_it_explains_an_error_without_a_json_body(fake_api):
    fake_api.on("GET", "queues/", httpx.Response(502, text="<html>Bad gateway</html>"))
    result = fake_api.run("queues", "ls")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: the server answered 502 Bad Gateway for ")


def test_it_explains_a_server_that_is_not_lakeshore(fake_api):
    fake_api.on("GET", "queues/", httpx.Response(200, text="<html>hello</html>"))
    result = fake_api.run("queues", "ls")
    assert result.exit_code == 1
    assert "not JSON" in result.stderr
    assert "Traceback" not in result.output


def test_it_says_how_to_start_an_unreachable_server():
    def refuse(request):
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    api = FakeApi()
    api.handle = refuse
    result = api.run("--url", "http://127.0.0.1:9", "queues", "ls")
    assert result.exit_code == 1
    assert result.stderr == (
        "error: cannot reach the Lakeshore server at http://127.0.0.1:9 ([Errno 111] "
        "Connection refused). Is it running? Start it with 'make run', or set --url / "
        "LAKESHORE_URL.\n"
    )


def test_it_reports_a_real_refused_connection(tmp_path):
    """No mock: the real httpx transport against a closed port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = CliRunner().invoke(cli, ["--url", f"http://127.0.0.1:{port}", "queues", "ls"])
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"error: cannot reach the Lakeshore server at http://127.0.0.1:{port} ("
    )
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_it_refuses_an_unreadable_auth_file(isolated_config, fake_api):
    isolated_config.parent.mkdir(parents=True)
    isolated_config.write_text("- just\n- a list\n")
    result = fake_api.run("queues", "ls")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot read {isolated_config}")


def test_a_daemon_with_a_misspelt_allowed_module_does_not_start(fake_api, monkeypatch):
    """`my-jobs` can be no module's name: every job naming the module meant would be
    refused later, one by one. The daemon says so and does not start (no request)."""
    monkeypatch.setenv("LAKESHORE_ALLOWED_MODULES", "my_jobs, my-jobs")
    result = fake_api.run("daemon", "run", "--queues", "py")
    assert result.exit_code == 1
    assert result.stderr == (
        "error: LAKESHORE_ALLOWED_MODULES: 'my-jobs' is not a module name; expected "
        "comma-separated module names (dotted identifiers, such as my_pkg.jobs)\n"
    )
    assert fake_api.requests == []
