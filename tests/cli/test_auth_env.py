"""`lakeshore auth env [--sdk] [--new-token]`, run through bash with the real installed
`lakeshore` command against a live server, and its lines given to the real Python SDK."""

import re
import shlex
import sys
from pathlib import Path

import pytest

from accounts.models import ApiToken
from jobs.models import Invocation
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]  # where tests.support.sdk_udfs imports from
FORGET_LOGIN = "unset LAKESHORE_URL LAKESHORE_TOKEN LAKESHORE_CLIENT_TOKEN LAKESHORE_NAMESPACE"


def exports(text: str) -> dict[str, str]:
    """The `export NAME=value` lines, read back as the shell reads them."""
    out = {}
    for line in text.splitlines():
        assert line.startswith("export "), line
        name, _, quoted = line.removeprefix("export ").partition("=")
        [out[name]] = shlex.split(quoted)
    return out


def test_the_sdk_lines_name_this_login_and_this_servers_namespace(sh, live_server, settings):
    settings.LAKESHORE_SDK_NAMESPACE = "team a; echo oops"  # the shell must not run this
    token = sh.env["LAKESHORE_TOKEN"]

    result = sh("lakeshore auth env --sdk")

    assert exports(result.stdout) == {
        "LAKESHORE_URL": live_server.url,
        "LAKESHORE_CLIENT_TOKEN": token,
        "LAKESHORE_NAMESPACE": "team a; echo oops",
    }
    assert result.stderr == ""
    evaluated = sh(
        f'lines="$(lakeshore auth env --sdk)"; {FORGET_LOGIN}; eval "$lines"; '
        'printf "%s|%s" "$LAKESHORE_NAMESPACE" "$LAKESHORE_CLIENT_TOKEN"'
    )
    assert evaluated.stdout == f"team a; echo oops|{token}"


def test_without_sdk_it_prints_the_clis_own_lines(sh, live_server):
    result = sh("lakeshore auth env")
    assert exports(result.stdout) == {
        "LAKESHORE_URL": live_server.url,
        "LAKESHORE_TOKEN": sh.env["LAKESHORE_TOKEN"],
    }
    # another shell with only these lines talks to the server
    sh(f'lines="$(lakeshore auth env)"; {FORGET_LOGIN}; eval "$lines"; lakeshore queues ls')


def test_not_logged_in_is_one_line_and_exit_1(sh):
    result = sh(f"{FORGET_LOGIN}; lakeshore auth env --sdk", exit=1)
    assert result.stdout == ""
    assert result.stderr == (
        "error: not logged in: no token to print (run 'lakeshore auth login', or set "
        "LAKESHORE_TOKEN)\n"
    )


def test_a_token_the_server_refuses_prints_nothing(sh):
    result = sh("LAKESHORE_TOKEN=lsk_not_a_token lakeshore auth env --sdk", exit=1)
    assert result.stdout == ""
    assert result.stderr.startswith("error: ")


def test_a_new_token_is_made_for_this_user_and_printed_instead(sh):
    before = set(ApiToken.objects.values_list("pk", flat=True))

    made = exports(sh("lakeshore auth env --sdk --new-token").stdout)
    scoped = exports(sh("lakeshore auth env --new-token --role daemon --queues gpu,cpu").stdout)

    operator, daemon = ApiToken.objects.exclude(pk__in=before).order_by("pk")
    assert (operator.user.username, operator.role, operator.name) == (
        "alice",
        "operator",
        "lakeshore auth env",
    )
    assert (daemon.role, daemon.queues) == ("daemon", ["gpu", "cpu"])
    assert made["LAKESHORE_CLIENT_TOKEN"] != sh.env["LAKESHORE_TOKEN"]
    assert made["LAKESHORE_CLIENT_TOKEN"].startswith(operator.prefix)
    assert scoped["LAKESHORE_TOKEN"].startswith(daemon.prefix)
    # the new token works on its own
    sh(f"LAKESHORE_TOKEN={made['LAKESHORE_CLIENT_TOKEN']} lakeshore queues ls")


def test_a_viewer_is_told_it_cannot_submit_and_cannot_make_tokens(sh):
    viewer = builders.token("viewer", username="val")
    shown = sh(f"LAKESHORE_TOKEN={viewer} lakeshore auth env --sdk")
    assert exports(shown.stdout)["LAKESHORE_CLIENT_TOKEN"] == viewer
    assert shown.stderr.startswith("# note: this token cannot submit from the SDK")
    refused = sh(f"LAKESHORE_TOKEN={viewer} lakeshore auth env --sdk --new-token", exit=1)
    assert refused.stdout == "" and refused.stderr.startswith("error: This needs the operator")


def test_role_without_new_token_is_a_usage_error(sh):
    assert "add --new-token" in sh("lakeshore auth env --role daemon", exit=2).stderr


def test_the_printed_lines_make_the_real_sdk_submit_here(sh, tmp_path):
    """The SDK in a fresh shell with only these lines: its default dispatch (no
    HttpDispatch in the script) submits to this server, not to a local SQLite file."""
    builders.queue(name="gpu")
    home = tmp_path / "home"
    home.mkdir()
    script = "from tests.support import sdk_udfs; print(sdk_udfs.add.submit(40, 2))"
    result = sh(
        f'lines="$(lakeshore auth env --sdk)"; {FORGET_LOGIN}; eval "$lines"; '
        f"cd {ROOT} && HOME={home} {sys.executable} -c {shlex.quote(script)}"
    )

    invocation = Invocation.objects.get(pk=int(result.stdout.strip()))
    assert (invocation.function, invocation.queue, invocation.state) == (
        "tests.support.sdk_udfs.add",
        "gpu",
        "queued",
    )
    assert not (home / ".lakeshore").exists()  # the SDK's local fallback was not used


def test_control_without_the_lines_the_sdk_queues_locally_and_says_nothing(sh, tmp_path):
    """What the README warns of: no LAKESHORE_URL, and the SDK's submit succeeds into a
    SQLite file under ~/.lakeshore, with an id of its own (a ULID), and nothing here."""
    builders.queue(name="gpu")
    home = tmp_path / "home"
    home.mkdir()
    script = "from tests.support import sdk_udfs; print(sdk_udfs.add.submit(40, 2))"
    result = sh(
        f"{FORGET_LOGIN}; cd {ROOT} && HOME={home} {sys.executable} -c {shlex.quote(script)}"
    )

    assert re.fullmatch(r"[0-9A-Z]{26}", result.stdout.strip()), result.stdout
    assert result.stderr == ""
    assert (home / ".lakeshore" / "dispatch.sqlite").is_file()
    assert not Invocation.objects.exists()
