"""The installed `lakeshore` command in a shell, against the live server: `sh` runs a
command line with bash and checks how it exited (`operator_token` is its login), and
`write` puts the file a command reads (a lakeshore.yaml) in its directory. A pytest
plugin: tests/conftest.py registers it."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accounts.services import token_create

BIN = Path(sys.executable).parent
LAKESHORE = BIN / "lakeshore"


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


def write(workdir, text: str, name: str = "lakeshore.yaml") -> None:
    (workdir / name).write_text(textwrap.dedent(text))
