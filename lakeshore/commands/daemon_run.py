"""`lakeshore daemon run` (start a daemon here) and `lakeshore daemon remove` (drop one)."""

import click

from lakeshore.client import Client, path
from lakeshore.context import State, pass_client
from lakeshore.output import emit, json_option
from lakeshore.params import NAME_MAX_LENGTH, NAME_PATTERN


def _queue_list(ctx, param, value: str) -> list[str]:
    import re

    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    for name in names:
        if len(name) > NAME_MAX_LENGTH or not re.fullmatch(NAME_PATTERN[1:-1], name):
            raise click.BadParameter(f"{name!r} is not a queue name ({NAME_PATTERN})", ctx, param)
    return names


@click.command()
@click.option(
    "--queues",
    default="",
    callback=_queue_list,
    metavar="A,B",
    help="Queues to serve, in order of preference (comma-separated). None: the default queue.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Invocations run at once.",
)
@click.option("--name", help="Daemon name (default: HOST-PID).")
@click.option(
    "--heartbeat",
    type=click.FloatRange(0.5, 300),
    default=10.0,
    show_default=True,
    help="Seconds between heartbeats (the server's timeout is 60 s by default).",
)
@click.pass_context
def run(ctx: click.Context, queues: list[str], concurrency: int, name, heartbeat) -> None:
    """Run a daemon here: claim invocations of QUEUES and run them until Ctrl-C/SIGTERM.

    It runs functions from lakeshore.functions (echo, sleep, fail) and from the modules
    in LAKESHORE_ALLOWED_MODULES (comma-separated). On the first SIGTERM or Ctrl-C it
    stops claiming, finishes what it runs and deregisters; a second one stops now.

    Each invocation runs in a process of its own that dies with the daemon, with a
    scrubbed environment: PATH, HOME, USER, LOGNAME, LANG, LC_*, TZ, TMPDIR, PYTHONPATH,
    VIRTUAL_ENV, plus LAKESHORE_INVOCATION_ID and LAKESHORE_ATTEMPT. LAKESHORE_JOB_ENV
    (comma-separated names) passes more, but never LAKESHORE_*, DJANGO_*, DATABASE_*,
    CELERY_* or other server settings and secrets.
    """
    from lakeshore.worker import Worker

    state = ctx.find_object(State) or State()
    worker = Worker(
        state.client(),
        queues=queues,
        concurrency=concurrency,
        name=name,
        heartbeat_interval=heartbeat,
    )
    worker.install_signal_handlers()
    ctx.exit(worker.run())


@click.command()
@click.argument("daemon_id", metavar="ID")
@json_option
@pass_client
def remove(client: Client, daemon_id: str, as_json: bool) -> None:
    """Drop a daemon: it is terminated and its running invocation ends killed."""
    answer = client.delete(path("daemons", daemon_id))

    def human(a):
        ended = f"; {a['ended']} running invocation(s) killed" if a.get("ended") else ""
        click.echo(f"daemon/{a['id']} removed{ended}")

    emit(answer, as_json, human)
