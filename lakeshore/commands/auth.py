"""`lakeshore auth login|logout|status|env`: the token in auth.yml, whether it works, and
the `export` lines that give it to another shell or to the Python SDK."""

import shlex
import sys

import click

from lakeshore.client import Client
from lakeshore.config import auth_file, mask, read_auth, write_auth
from lakeshore.context import State
from lakeshore.errors import ApiError, CliError, Unreachable
from lakeshore.output import fields


@click.group()
def auth() -> None:
    """Save, remove or check the API token the CLI uses, or print it for another shell
    or the Python SDK (env)."""


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


# What the Python SDK (dreamlake-lakeshore 0.5.0) reads when a script makes no dispatch of
# its own (functions._default_dispatch): the server, its token and its namespace. The
# CLI reads LAKESHORE_CLIENT_TOKEN too, before LAKESHORE_TOKEN (lakeshore.config).
SDK_ENV = ("LAKESHORE_URL", "LAKESHORE_CLIENT_TOKEN", "LAKESHORE_NAMESPACE")
MADE_BY = "lakeshore auth env"  # the name a new token gets


@auth.command()
@click.option(
    "--sdk",
    is_flag=True,
    help="The Python SDK's lines (LAKESHORE_URL, LAKESHORE_CLIENT_TOKEN, "
    "LAKESHORE_NAMESPACE) instead of the CLI's (LAKESHORE_URL, LAKESHORE_TOKEN).",
)
@click.option(
    "--new-token",
    is_flag=True,
    help="Make a new token for this login's user and print it instead of the one in use "
    "(operators only; it is shown once).",
)
@click.option(
    "--role",
    type=click.Choice(["operator", "daemon", "viewer"]),
    help="The new token's role (default operator: the SDK's submit needs it; daemon for "
    "an SDK worker).",
)
@click.option(
    "--queues", metavar="Q1,Q2", help="Scope a new daemon token to these queues (comma-separated)."
)
@click.pass_obj
def env(state: State, sdk: bool, new_token: bool, role: str | None, queues: str | None) -> None:
    """Print `export` lines for this login: eval "$(lakeshore auth env --sdk)".

    The server and token are the ones the CLI uses now (flag, environment, auth.yml),
    checked with the server first. The values are shell-quoted; notes go to stderr.
    """
    if (role or queues) and not new_token:
        raise click.UsageError("--role and --queues describe a new token: add --new-token")
    settings = state.settings()
    if not settings.token:
        raise CliError(
            "not logged in: no token to print (run 'lakeshore auth login', or set LAKESHORE_TOKEN)"
        )
    client = state.client(settings)
    setup = client.get("sdk/")  # checks the token, and says what the SDK needs
    token = settings.token
    if new_token:
        role = role or "operator"
        body = {"user": setup["user"], "role": role, "name": MADE_BY}
        if queues is not None:
            body["queues"] = [q.strip() for q in queues.split(",")]
        made = client.post("tokens/", json=body)
        token = made["token"]
        click.echo(
            f"# a new {role} token for {setup['user']} (id {made['id']}, shown once); revoke "
            f"it on {settings.server}/tokens/",
            err=True,
        )
    elif sdk and "operator" not in setup["roles"]:
        click.echo(
            "# note: this token cannot submit from the SDK (that needs the operator role); "
            "'lakeshore auth env --sdk --new-token' makes one, if your user may",
            err=True,
        )
    values = (
        dict(zip(SDK_ENV, (settings.server, token, setup["namespace"]), strict=True))
        if sdk
        else {"LAKESHORE_URL": settings.server, "LAKESHORE_TOKEN": token}
    )
    for name, value in values.items():
        click.echo(f"export {name}={shlex.quote(value)}")
