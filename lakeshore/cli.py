"""`lakeshore`: a thin client of the Lakeshore REST API."""

import click

from lakeshore import __version__
from lakeshore.commands.apply import apply, export
from lakeshore.commands.auth import auth
from lakeshore.commands.daemon import daemon
from lakeshore.commands.daemon_run import remove as daemon_remove
from lakeshore.commands.daemon_run import run as daemon_run
from lakeshore.commands.jobs import jobs
from lakeshore.commands.providers import providers
from lakeshore.commands.queues import queues
from lakeshore.commands.stats import stats
from lakeshore.context import State
from lakeshore.errors import ApiError, CliError, refused_token_hint, report


class LakeshoreGroup(click.Group):
    """Turns every CliError raised below into `error: ...` on stderr and its exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CliError as error:
            if isinstance(error, ApiError) and error.status == 401:
                error.hint = refused_token_hint(_token_source(ctx))
            report(error)
            ctx.exit(error.exit_code)


def _token_source(ctx: click.Context) -> str | None:
    """Where the refused token came from, as the request found it."""
    state = ctx.find_object(State) or State()
    try:
        return state.settings().token_source
    except CliError:
        return None


@click.group(cls=LakeshoreGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    metavar="URL",
    help="Server address. Else $LAKESHORE_URL, auth.yml 'server', http://localhost:8080.",
)
@click.option(
    "--token",
    metavar="TOKEN",
    help="API token. Else $LAKESHORE_CLIENT_TOKEN, $LAKESHORE_TOKEN, auth.yml 'token'.",
)
@click.version_option(__version__, prog_name="lakeshore")
@click.pass_context
def cli(ctx: click.Context, url: str | None, token: str | None) -> None:
    """Manage Lakeshore queues, jobs, providers and daemons from the command line."""
    state = ctx.ensure_object(State)
    state.url = url or state.url
    state.token = token or state.token


for group in (queues, jobs, stats, providers, daemon, auth, apply, export):
    cli.add_command(group)
daemon.add_command(daemon_run, name="run")
daemon.add_command(daemon_remove, name="remove")


def main() -> None:
    cli(prog_name="lakeshore")
