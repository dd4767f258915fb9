"""The CLI tests. Unit tests answer HTTP with `FakeApi` (no server); the cookbook tests run
the installed `lakeshore` command against `live_server`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accounts.services import token_create
from tests.cli.fakes import FakeApi

BIN = Path(sys.executable).parent
LAKESHORE = BIN / "lakeshore"


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


class Shell:
    """Runs command lines with bash, `lakeshore` on the PATH, pointed at the live server."""

    def __init__(self, env: dict):
        self.env = env

    def __call__(self, line: str, *, exit: int = 0) -> subprocess.CompletedProcess:
        result = subprocess.run(
            ["bash", "-c", line], env=self.env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == exit, (
            f"{line!r} exited {result.returncode}, wanted {exit}\n"
            f"stdout: {result.stdout}\nstderr: {result.stderr}"
        )
        assert "Traceback" not in result.stderr
        return result

    def json(self, line: str):
        return json.loads(self(line).stdout)


@pytest.fixture
def operator_token():
    _, raw = token_create(username="alice", role="operator")
    return raw


@pytest.fixture
def sh(live_server, tmp_path, operator_token):
    assert LAKESHORE.exists(), f"{LAKESHORE} is missing: run 'make install'"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKESHORE_")}
    env.update(
        LAKESHORE_URL=live_server.url,
        LAKESHORE_TOKEN=operator_token,
        XDG_CONFIG_HOME=str(tmp_path),
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        COLUMNS="200",
    )
    return Shell(env)
