"""`lakeshore daemon run` (start a daemon here) and `lakeshore daemon remove` (drop one)."""

import os
import re

import click

from lakeshore.allow import MODULES_EXPECTED, not_modules, parse_modules
from lakeshore.client import Client, path
from lakeshore.context import State, pass_client
from lakeshore.errors import CliError
from lakeshore.output import emit, json_option
from lakeshore.params import NAME_MAX_LENGTH, NAME_PATTERN


def _queue_list(ctx, param, value: str) -> list[str]:

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
@click.option(
    "--isolation",
    type=click.Choice(["pool", "process"]),
    default="pool",
    show_default=True,
    help="pool: each slot keeps a warm job process that runs many invocations (replaced "
    "after --max-tasks-per-worker, a failed invocation, a timeout or --max-worker-memory). "
    "process: a fresh process per invocation, for code that must not share one.",
)
@click.option(
    "--max-tasks-per-worker",
    type=click.IntRange(0),
    default=100,
    show_default=True,
    help="pool: invocations a job process runs before it is replaced (0: no limit).",
)
@click.option(
    "--max-worker-memory",
    type=click.IntRange(0),
    default=1024,
    show_default=True,
    metavar="MB",
    help="pool: a job process whose resident memory (VmRSS) is above this after an "
    "invocation is replaced (0: no limit).",
)
@click.option(
    "--allow-pickled",
    is_flag=True,
    help="Also run the Python SDK's pickled functions (thunks, lambdas, functions defined "
    "in __main__): code to execute, so only where you trust who submits to these queues.",
)
@click.option(
    "-v", "--verbose", is_flag=True, help="Also log each batch of reports and each replacement."
)
@click.pass_context
def run(
    ctx: click.Context,
    queues: list[str],
    concurrency: int,
    name,
    heartbeat,
    isolation: str,
    max_tasks_per_worker: int,
    max_worker_memory: int,
    allow_pickled: bool,
    verbose: bool,
) -> None:
    """Run a daemon here: claim invocations of QUEUES and run them until Ctrl-C/SIGTERM.

    It runs functions from lakeshore.functions (echo, sleep, fail) and from the modules
    in LAKESHORE_ALLOWED_MODULES (comma-separated), and the Python SDK's @dls.udf calls
    of those modules (with dreamlake-lakeshore installed here; modules are imported
    from this directory too). On the first SIGTERM or Ctrl-C it
    stops claiming, finishes what it runs and deregisters; a second one stops now.

    Invocations run in job processes that die with the daemon, each leading a process
    group of its own, with a scrubbed environment: PATH, HOME, USER, LOGNAME, LANG,
    LC_*, TZ, TMPDIR, PYTHONPATH, VIRTUAL_ENV, plus LAKESHORE_INVOCATION_ID and
    LAKESHORE_ATTEMPT (set for each invocation). LAKESHORE_JOB_ENV (comma-separated
    names) passes more, but never LAKESHORE_*, DJANGO_*, DATABASE_*, CELERY_* or other
    server settings and secrets. With --isolation pool (the default) a job process runs
    one invocation after another (its imports stay loaded); module-level state survives
    from one to the next until the process is replaced.
    """
    allowed = parse_modules(os.environ.get("LAKESHORE_ALLOWED_MODULES", ""))
    if bad := not_modules(allowed):
        raise CliError(
            f"LAKESHORE_ALLOWED_MODULES: {', '.join(map(repr, bad))} is not a module name; "
            f"expected {MODULES_EXPECTED}"
        )
    # Here, not at the top: the daemon's modules (pool, ctypes, SDK runner) would add
    # about 30 ms to every lakeshore command.
    from lakeshore.worker.daemon import Worker, stderr_log  # noqa: PLC0415

    state = ctx.find_object(State) or State()
    worker = Worker(
        state.client(),
        queues=queues,
        concurrency=concurrency,
        name=name,
        heartbeat_interval=heartbeat,
        isolation=isolation,
        max_tasks_per_worker=max_tasks_per_worker,
        max_worker_memory=max_worker_memory,
        allow_pickled=allow_pickled,
        debug=stderr_log if verbose else None,
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
