"""`lakeshore auth login|logout|status`: the token in auth.yml and whether it works."""

import sys

import click

from lakeshore.client import Client
from lakeshore.config import auth_file, mask, read_auth, write_auth
from lakeshore.context import State
from lakeshore.errors import ApiError, CliError, Unreachable
from lakeshore.output import fields


@click.group()
def auth() -> None:
    """Save, remove or check the API token the CLI uses."""


@auth.command()
@click.option("--url", metavar="URL", help="Server to log in to (else the usual lookup).")
@click.option("--token", metavar="TOKEN", help="The token (else prompted for, or read from stdin).")
@click.pass_obj
def login(state: State, url: str | None, token: str | None) -> None:
    """Check a token against the server, then save both in auth.yml (mode 0600)."""
    server = (url or state.url or state.settings().server).rstrip("/")
    token = token or state.token or _read_token()
    try:
        Client(server, token, transport=state.transport).get("queues/", limit=1)
    except ApiError as error:
        if error.status not in (401, 403):
            raise
        raise CliError(f"the server at {server} refused the token: {error.message}") from None
    try:
        saved = read_auth()
    except CliError:
        saved = {}  # an unreadable file is replaced
    saved.update(server=server, token=token)
    click.echo(f"Logged in to {server}; token saved to {write_auth(saved)}")


def _read_token() -> str:
    on_tty = sys.stdin.isatty()
    token = (click.prompt("Token", hide_input=True) if on_tty else sys.stdin.readline()).strip()
    if not token:
        raise click.UsageError("no token given: pass --token, or type or pipe it on stdin")
    return token


@auth.command()
def logout() -> None:
    """Remove the saved token from auth.yml (the server address stays)."""
    saved = read_auth()
    if not saved.pop("token", None):
        click.echo(f"No token saved in {auth_file()}.")
        return
    click.echo(f"Token removed from {write_auth(saved)}.")


@auth.command()
@click.pass_obj
def status(state: State) -> None:
    """Show the server, where the token comes from, and whether the server accepts it."""
    settings = state.settings()
    token_line = (
        f"{mask(settings.token)} (from {settings.token_source})" if settings.token else "none"
    )
    lines = [
        ("Server", f"{settings.server} (from {settings.server_source})"),
        ("Token", token_line),
    ]
    if not settings.token:
        fields([*lines, ("Accepted", "no")])
        raise CliError("no token: run 'lakeshore auth login' or set LAKESHORE_TOKEN")
    try:
        state.client(settings).get("queues/", limit=1)
    except (ApiError, Unreachable) as error:
        fields([*lines, ("Accepted", "no")])
        raise error from None
    fields([*lines, ("Accepted", "yes")])
