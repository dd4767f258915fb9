"""The CLI tests. Unit tests answer HTTP with `FakeApi` (no server); the cookbook tests run
the installed `lakeshore` command against `live_server` (`sh`: tests/support/shell.py)."""

import pytest

from tests.cli.fakes import FakeApi


@pytest.fixture(autouse=True)
def isolated_config(tmp_path, monkeypatch):
    """Never read or write the real ~/.config, never pick up the caller's server or token."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("LAKESHORE_URL", "LAKESHORE_TOKEN", "LAKESHORE_CLIENT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "config" / "lakeshore" / "auth.yml"


@pytest.fixture
def fake_api():
    return FakeApi()
