"""Where the CLI finds its server and token: flag, environment, auth.yml, default."""

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from lakeshore.errors import CliError
from lakeshore.private import write_private

DEFAULT_SERVER = "http://localhost:8080"
SERVER_ENV = "LAKESHORE_URL"
TOKEN_ENVS = ("LAKESHORE_CLIENT_TOKEN", "LAKESHORE_TOKEN")


def auth_file() -> Path:
    """`$XDG_CONFIG_HOME/lakeshore/auth.yml`, else `~/.config/lakeshore/auth.yml`."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "lakeshore" / "auth.yml"


def read_auth() -> dict:
    path = auth_file()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        return {}
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise CliError(f"cannot read {path}: expected 'server:' and 'token:' keys")
    return data


def write_auth(data: dict) -> Path:
    """Write auth.yml readable by its owner only: a new file, created 0600 in one step,
    replaces it (lakeshore.private), even if it existed before with another mode."""
    path = auth_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return write_private(path, yaml.safe_dump(data, default_flow_style=False))


@dataclass(frozen=True)
class Settings:
    server: str
    server_source: str
    token: str | None
    token_source: str | None


def resolve(url: str | None = None, token: str | None = None) -> Settings:
    """The server and token, each from the first place that has one."""
    saved: dict | None = None

    def from_file(key: str) -> str | None:
        nonlocal saved
        if saved is None:
            saved = read_auth()
        value = saved.get(key)
        return str(value) if value else None

    if url:
        server, server_source = url, "--url"
    elif os.environ.get(SERVER_ENV):
        server, server_source = os.environ[SERVER_ENV], SERVER_ENV
    elif saved_server := from_file("server"):
        server, server_source = saved_server, str(auth_file())
    else:
        server, server_source = DEFAULT_SERVER, "default"

    token_source: str | None = None
    if token:
        token_source = "--token"  # noqa: S105 (where the token came from, not a token)
    else:
        for name in TOKEN_ENVS:
            if os.environ.get(name):
                token, token_source = os.environ[name], name
                break
        else:
            token = from_file("token")
            token_source = str(auth_file()) if token else None
    return Settings(server.rstrip("/"), server_source, token or None, token_source)


def mask(token: str) -> str:
    if len(token) <= 12:
        return "*" * len(token)
    return f"{token[:8]}…{token[-4:]}"
