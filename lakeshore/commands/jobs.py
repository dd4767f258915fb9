"""`lakeshore jobs list|show|logs|kill|retry|bulk-cancel|submit`: invocations tracked by
the control plane (`logs` lives in job_logs.py, `submit --batch` in job_batch.py)."""

import json
import time

import click
from click.core import ParameterSource

from lakeshore.client import Client, path
from lakeshore.commands.job_batch import CHUNK_MAX_LINES, Submission, submit_lines
from lakeshore.commands.job_logs import logs
from lakeshore.context import pass_client
from lakeshore.output import echo, emit, fields, json_option, queue_label, table, when
from lakeshore.params import JsonOf

JOB_STATES = ["queued", "running", "succeeded", "failed", "killed", "timeout"]


def _not_empty(ctx, param, value):
    if value is not None and not value.strip():
        raise click.BadParameter("is empty: give an id (is the shell variable set?)", ctx, param)
    return value


def print_jobs(jobs: list[dict]) -> None:
    table(
        ["ID", "QUEUE", "FUNCTION", "STATE", "WORKER", "ATTEMPTS", "PRIORITY", "CREATED"],
        [
            [
                j["id"],
                queue_label(j.get("queue")),
                j.get("function"),
                j.get("state"),
                j.get("worker"),
                f"{j.get('attempts')}/{j.get('max_attempts')}",
                j.get("priority"),
                when(j.get("created_at")),
            ]
            for j in jobs
        ],
    )


def print_job(j: dict) -> None:
    position = j.get("position")
    ahead = None
    if position:
        count = position["ahead"]
        ahead = f"{count:g}{'+' if position.get('capped') else ''} ahead"
        ahead += "" if position.get("exact") else " (expected)"
    result = None if j.get("result") is None else json.dumps(j.get("result"))
    args: str = json.dumps(j.get("args"))
    kwargs: str | None = json.dumps(j.get("kwargs"))
    if j.get("wire"):  # from the Python SDK: opaque msgpack, shown by its size
        what = "SDK envelope" if j["wire"] == "envelope" else "SDK value"
        args, kwargs = f"{j.get('args_bytes') or 0:,} bytes ({what}, msgpack)", None
        if j.get("result_bytes") is not None:
            result = f"{j['result_bytes']:,} bytes (msgpack)"
    fields(
        [
            ("ID", j["id"]),
            ("Function", j.get("function")),
            ("Queue", queue_label(j.get("queue"))),
            ("State", j.get("state")),
            ("Position", ahead),
            ("Priority", j.get("priority")),
            ("Worker", j.get("worker")),
            ("Attempts", f"{j.get('attempts')}/{j.get('max_attempts')}"),
            ("Timeout", f"{j['timeout_s']} s" if j.get("timeout_s") else None),
            ("Key", j.get("key")),
            ("Args", args),
            ("Kwargs", kwargs),
            ("Result", result),
            ("Reason", j.get("reason")),
            *([("Retry of", f"job/{j['retry_of']}")] if j.get("retry_of") else []),
            *([("Retried as", f"job/{j['retried_as']}")] if j.get("retried_as") else []),
            ("Created", when(j.get("created_at"))),
            ("Started", when(j.get("started_at"))),
            ("Finished", when(j.get("finished_at"))),
        ]
    )
    if j.get("discarded_outcome"):  # killed while it ran, but it had finished first
        click.echo("Note:")
        echo(f"  {finished_before_kill(j)}")
    if j.get("error"):
        click.echo("Error:")
        for line in str(j["error"]).rstrip().split("\n"):  # not splitlines: \r stays shown
            echo(f"  {line}")


def finished_before_kill(j: dict) -> str:
    """What happened to a job killed while it ran that had finished its work before the
    kill reached its daemon: the words the job's page in the console uses."""
    why = f": {j['reason']}" if j.get("reason") else ""
    return (
        f"Killed at {when(j.get('finished_at'))}{why}. The job had already finished its "
        f"work before the kill reached it: its daemon reported {j['discarded_outcome']} at "
        f"{when(j.get('discarded_at'))}, and that outcome was discarded (a killed job "
        "stays killed)."
    )


@click.group()
def jobs() -> None:
    """Invocations (jobs): list, show, kill, retry, bulk-cancel, submit."""


jobs.add_command(logs)


@jobs.command("list")
@click.option(
    "--limit",
    type=click.IntRange(1, 200),
    default=50,
    show_default=True,
    help="How many, 1–200.",
)
@click.option(
    "--offset", type=click.IntRange(min=0), default=0, show_default=True, help="How many to skip."
)
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(JOB_STATES),
    help="Only these states (repeatable).",
)
@click.option("--worker", metavar="ID", callback=_not_empty, help="Only this daemon's jobs.")
@click.option("--queue", metavar="ID", callback=_not_empty, help="Only this queue's jobs.")
@click.option(
    "--search",
    metavar="TEXT",
    callback=_not_empty,
    help="Only jobs whose function, key or error holds TEXT (3 characters or more).",
)
@json_option
@pass_client
def list_(client: Client, limit, offset, states, worker, queue, search, as_json) -> None:
    """Recent invocations, newest first."""
    params = {
        "limit": limit,
        "offset": offset or None,
        "daemon": worker,
        "queue": queue,
        "search": search,
    }
    query = [(k, v) for k, v in params.items() if v is not None]
    query += [("state", s) for s in states]
    found = client.request("GET", "jobs/", params=query)
    if not found and not as_json:
        click.echo("No jobs found.", err=True)
        return
    emit(found, as_json, print_jobs)


@jobs.command()
@click.argument("job_id", metavar="ID")
@json_option
@pass_client
def show(client: Client, job_id: str, as_json: bool) -> None:
    """One invocation; a queued one shows its position in its queue."""
    emit(client.get(path("jobs", job_id)), as_json, print_job)


@jobs.command()
@click.argument("job_id", metavar="ID")
@click.option("--reason", default="", help="Why (stored on the invocation).")
@json_option
@pass_client
def kill(client: Client, job_id: str, reason: str, as_json: bool) -> None:
    """Cancel one queued invocation (running ones: drop the daemon instead)."""
    killed = client.post(path("jobs", job_id, "kill"), json={"reason": reason})
    emit(killed, as_json, lambda j: click.echo(f"job/{j['id']} killed"))


RETRYABLE = ["failed", "timeout", "killed"]
search_option = click.option(
    "--search",
    metavar="TEXT",
    callback=_not_empty,
    help="Only jobs whose function, key or error holds TEXT (3 characters or more).",
)


@jobs.command()
@click.argument("job_id", metavar="ID", required=False)
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(RETRYABLE),
    help="Retry every job that ended so (repeatable), not one ID.",
)
@click.option("--queue", metavar="NAME", help="Only this queue's jobs ('' the default queue).")
@search_option
@click.option("--since", metavar="WHEN", help="Only jobs that ended since: 30m, 1h, 7d or a time.")
@click.option("--dry-run", is_flag=True, help="Count what would be retried; change nothing.")
@json_option
@pass_client
def retry(client: Client, job_id, states, queue, search, since, dry_run, as_json) -> None:
    """Queue a failed, timed-out or killed invocation again, as a new invocation linked
    to it (the old one keeps its error). Once per invocation: retry the retry if it
    fails too. With --state instead of an ID: every match, in batches."""
    bulk = {"--queue": queue, "--search": search, "--since": since, "--dry-run": dry_run}
    if job_id is not None:
        given = ["--state"] * bool(states)
        given += [name for name, value in bulk.items() if value not in (None, False)]
        if given:
            raise click.UsageError(f"give an ID or filters, not both: {', '.join(given)}")
        new = client.post(path("jobs", job_id, "retry"))
        emit(
            new, as_json, lambda j: click.echo(f"job/{j.get('retry_of')} retried as job/{j['id']}")
        )
        return
    if not states:
        raise click.UsageError(
            "give an ID, or --state failed (and more filters) to retry every match"
        )
    filters = {"queue": queue, "search": search, "since": since}
    body: dict = {"state": list(states), "dry_run": dry_run}
    body |= {name: value for name, value in filters.items() if value is not None}
    answer = client.post("jobs/bulk-retry/", json=body)

    def human(a):
        if a["dry_run"]:
            click.echo(f"would retry {a['matched']:,} job(s): {a['filter']}")
        else:
            click.echo(f"retried {a['retried']:,} job(s): {a['filter']}")

    emit(answer, as_json, human)


@jobs.command("bulk-cancel")
@click.option("--queue", metavar="NAME", help="Only this queue's queued invocations.")
@search_option
@click.option("--since", metavar="WHEN", help="Only jobs submitted since: 30m, 1h, 7d or a time.")
@click.option("--reason", default="", help="Why (stored on each invocation).")
@click.option("--dry-run", is_flag=True, help="Count what would be cancelled; change nothing.")
@json_option
@pass_client
def bulk_cancel(client: Client, queue, search, since, reason, dry_run, as_json) -> None:
    """Cancel every queued invocation (that matches the filters); running work is untouched."""
    given = {"queue": queue, "search": search, "since": since}
    body = {"reason": reason, "dry_run": dry_run}
    body |= {name: value for name, value in given.items() if value is not None}
    answer = client.post("jobs/bulk-cancel/", json=body)

    def human(a):
        where = f" in queue {queue}" if queue is not None else ""
        where += f" holding {search!r}" if search else ""
        where += f" submitted since {since}" if since else ""
        verb = "would cancel" if a["dry_run"] else "cancelled"
        click.echo(f"{verb} {a['cancelled']} queued invocation(s){where}")

    emit(answer, as_json, human)


@jobs.command()
@click.argument("function")
@click.option("--queue", metavar="NAME", help="Queue name (default: the default queue).")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option(
    "--args", "args", type=JsonOf(list), default="[]", help="Positional args, a JSON array."
)
@click.option(
    "--kwargs", "kwargs", type=JsonOf(dict), default="{}", help="Keyword args, a JSON object."
)
@click.option("--key", default="", help="Idempotency key: a repeat returns the first job.")
@click.option(
    "--timeout", "timeout_s", type=click.IntRange(min=1), help="Seconds before it times out."
)
@click.option(
    "--max-attempts", type=click.IntRange(1, 100), default=1, show_default=True, help="Tries."
)
@click.option(
    "--batch",
    metavar="FILE",
    help="Many: JSON lines, one {args, kwargs, key, priority} object a line ('-' reads "
    "standard input); the other flags apply to every line, --priority to a line without one.",
)
@click.option(
    "--chunk-size",
    type=click.IntRange(1, CHUNK_MAX_LINES),
    default=CHUNK_MAX_LINES,
    show_default=True,
    help="With --batch: lines per request.",
)
@json_option
@pass_client
def submit(
    client: Client,
    function,
    queue,
    priority,
    args,
    kwargs,
    key,
    timeout_s,
    max_attempts,
    batch,
    chunk_size,
    as_json,
):
    """Queue one invocation of FUNCTION (a dotted path, e.g. lakeshore.functions.echo),
    or one a line of a JSON lines file with --batch: all of a file's lines are checked
    before any is sent, and each request of up to --chunk-size lines is queued whole or
    not at all."""
    ctx = click.get_current_context()
    given = {
        name
        for name in ("args", "kwargs", "key", "chunk_size")
        if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
    }
    if batch is not None:
        if clashing := [f"--{name}" for name in ("args", "kwargs", "key") if name in given]:
            raise click.UsageError(
                f"--batch reads args, kwargs and key from each line: drop {' and '.join(clashing)}",
                ctx,
            )
        submission = Submission(function, queue or "", priority, timeout_s, max_attempts)
        submit_lines(client, batch, submission, as_json=as_json, max_lines=chunk_size)
        return
    if "chunk_size" in given:
        raise click.UsageError("--chunk-size goes with --batch", ctx)
    body = {
        "function": function,
        "queue": queue or "",
        "priority": priority,
        "args": args,
        "kwargs": kwargs,
        "key": key,
        "timeout_s": timeout_s,
        "max_attempts": max_attempts,
    }
    response = client.send("POST", "jobs/", json=body)
    job = client.decode(response)

    def human(j):
        if response.status_code == 200:
            click.echo(f"job/{j['id']} already exists with key {key!r} ({j['state']})")
        else:
            click.echo(f"job/{j['id']} queued in {queue_label(j.get('queue'))}")

    emit(job, as_json, human)
    # Nothing served its queue as it was queued: the server says how to start a daemon.
    # A daemon started just before (`daemon run … &` on the line above) may still be
    # registering: look again for a moment before telling the user to start one.
    if job.get("hint") and (as_json or not _served_soon(client, job.get("queue") or "")):
        echo(f"note: {job['hint']}", err=True)


SERVED_GRACE_SECONDS = 3.0  # a daemon starting in the same shell registers within it


def _served_soon(client: Client, queue: str) -> bool:
    """Whether a live daemon serves `queue` within SERVED_GRACE_SECONDS (its stats)."""
    deadline = time.monotonic() + SERVED_GRACE_SECONDS
    while True:
        stats = client.get(path("queues", queue_label(queue), "stats"))
        if stats.get("daemons"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)
