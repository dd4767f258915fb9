import stat

import pytest
import yaml

from lakeshore.config import DEFAULT_SERVER, resolve, write_auth


def save(path, **values):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(values))


class TestServerLookup:
    def test_it_defaults_to_make_runs_address(self):
        settings = resolve()
        assert (settings.server, settings.server_source) == (DEFAULT_SERVER, "default")
        assert DEFAULT_SERVER == "http://localhost:8080"

    def test_it_prefers_the_file_to_the_default(self, isolated_config):
        save(isolated_config, server="http://file:1")
        assert resolve().server == "http://file:1"
        assert resolve().server_source == str(isolated_config)

    def test_it_prefers_the_environment_to_the_file(self, isolated_config, monkeypatch):
        save(isolated_config, server="http://file:1")
        monkeypatch.setenv("LAKESHORE_URL", "http://env:2/")
        assert (resolve().server, resolve().server_source) == ("http://env:2", "LAKESHORE_URL")

    def test_it_prefers_the_flag_to_everything(self, isolated_config, monkeypatch):
        save(isolated_config, server="http://file:1")
        monkeypatch.setenv("LAKESHORE_URL", "http://env:2")
        assert resolve(url="http://flag:3").server == "http://flag:3"


class TestTokenLookup:
    def test_it_has_no_token_by_default(self):
        assert (resolve().token, resolve().token_source) == (None, None)

    def test_it_reads_the_file(self, isolated_config):
        save(isolated_config, token="from-file")
        assert resolve().token == "from-file"

    @pytest.mark.parametrize(
        ("set_env", "expected"),
        [
            ({"LAKESHORE_TOKEN": "plain"}, "plain"),
            ({"LAKESHORE_CLIENT_TOKEN": "client"}, "client"),
            ({"LAKESHORE_CLIENT_TOKEN": "client", "LAKESHORE_TOKEN": "plain"}, "client"),
        ],
    )
    def test_it_prefers_the_environment_to_the_file(
        self, isolated_config, monkeypatch, set_env, expected
    ):
        save(isolated_config, token="from-file")
        for name, value in set_env.items():
            monkeypatch.setenv(name, value)
        settings = resolve()
        assert settings.token == expected
        assert settings.token_source == next(n for n, v in set_env.items() if v == expected)

    def test_it_prefers_the_flag_to_everything(self, isolated_config, monkeypatch):
        save(isolated_config, token="from-file")
        monkeypatch.setenv("LAKESHORE_CLIENT_TOKEN", "client")
        monkeypatch.setenv("LAKESHORE_TOKEN", "plain")
        assert (resolve(token="flag").token, resolve(token="flag").token_source) == (
            "flag",
            "--token",
        )


def test_it_honours_xdg_config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "elsewhere"))
    path = write_auth({"server": "http://x:1", "token": "t"})
    assert path == tmp_path / "elsewhere" / "lakeshore" / "auth.yml"
    assert resolve().server == "http://x:1"


def test_it_writes_auth_yml_readable_by_its_owner_only(isolated_config):
    isolated_config.parent.mkdir(parents=True)
    isolated_config.write_text("server: http://old\n")
    isolated_config.chmod(0o644)
    write_auth({"server": "http://new", "token": "secret"})
    assert stat.S_IMODE(isolated_config.stat().st_mode) == 0o600
    assert yaml.safe_load(isolated_config.read_text()) == {
        "server": "http://new",
        "token": "secret",
    }
