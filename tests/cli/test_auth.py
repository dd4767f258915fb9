"""`lakeshore auth login|logout|status` without a server."""

import stat

import yaml

from lakeshore.config import DEFAULT_SERVER

UNAUTHORIZED = {"error": {"code": "not_authenticated", "message": "Invalid token.", "fields": {}}}


def test_login_checks_the_token_then_saves_it_owner_only(fake_api, isolated_config):
    fake_api.on("GET", "queues/", json=[])
    result = fake_api.run("auth", "login", "--url", "http://lake:8080/", "--token", "lsk_secret")
    assert result.exit_code == 0, result.output
    assert fake_api.last.headers["Authorization"] == "Bearer lsk_secret"
    assert fake_api.last.url.params["limit"] == "1"
    assert str(fake_api.last.url).startswith("http://lake:8080/api/v1/queues/")
    assert yaml.safe_load(isolated_config.read_text()) == {
        "server": "http://lake:8080",
        "token": "lsk_secret",
    }
    assert stat.S_IMODE(isolated_config.stat().st_mode) == 0o600
    assert "Logged in to http://lake:8080" in result.stdout


def test_login_reads_a_piped_token(fake_api, isolated_config):
    fake_api.on("GET", "queues/", json=[])
    result = fake_api.run("auth", "login", input="lsk_piped\n")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(isolated_config.read_text()) == {
        "server": DEFAULT_SERVER,
        "token": "lsk_piped",
    }


def test_login_saves_nothing_when_the_server_refuses(fake_api, isolated_config):
    fake_api.on("GET", "queues/", status=401, json=UNAUTHORIZED)
    result = fake_api.run("auth", "login", "--token", "bad")
    assert result.exit_code == 1
    assert (
        result.stderr
        == f"error: the server at {DEFAULT_SERVER} refused the token: Invalid token.\n"
    )
    assert not isolated_config.exists()


def test_login_wants_a_token(fake_api):
    assert fake_api.run("auth", "login", input="\n").exit_code == 2


def test_logout_removes_the_token_and_keeps_the_server(fake_api, isolated_config):
    isolated_config.parent.mkdir(parents=True)
    isolated_config.write_text("server: http://lake:1\ntoken: lsk_x\n")
    result = fake_api.run("auth", "logout")
    assert result.exit_code == 0
    assert yaml.safe_load(isolated_config.read_text()) == {"server": "http://lake:1"}
    assert fake_api.run("auth", "logout").stdout.startswith("No token saved in ")


def test_status_shows_where_things_come_from_and_a_masked_token(fake_api, monkeypatch):
    monkeypatch.setenv("LAKESHORE_TOKEN", "lsk_abcdefghijklmnopqrstuvwxyz")
    monkeypatch.setenv("LAKESHORE_URL", "http://lake:1")
    fake_api.on("GET", "queues/", json=[])
    result = fake_api.run("auth", "status")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "Server:   http://lake:1 (from LAKESHORE_URL)",
        "Token:    lsk_abcd…wxyz (from LAKESHORE_TOKEN)",
        "Accepted: yes",
    ]
    assert "efghijkl" not in result.output


def test_status_exits_1_when_the_server_refuses_the_token(fake_api, monkeypatch):
    monkeypatch.setenv("LAKESHORE_TOKEN", "lsk_abcdefghijklmnopqrstuvwxyz")
    fake_api.on("GET", "queues/", status=401, json=UNAUTHORIZED)
    result = fake_api.run("auth", "status")
    assert result.exit_code == 1
    assert "Accepted: no" in result.stdout
    assert "error: Invalid token." in result.stderr


def test_status_exits_1_without_a_token(fake_api):
    result = fake_api.run("auth", "status")
    assert result.exit_code == 1
    assert "Token:    none" in result.stdout
    assert fake_api.requests == []


def test_the_global_token_flag_reaches_the_server(fake_api, monkeypatch):
    monkeypatch.setenv("LAKESHORE_TOKEN", "from-env")
    fake_api.on("GET", "queues/", json=[])
    fake_api.run("--token", "from-flag", "queues", "ls")
    assert fake_api.last.headers["Authorization"] == "Bearer from-flag"
