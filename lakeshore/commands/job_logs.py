"""`lakeshore jobs logs JOB`: what a job printed, per attempt, and `--follow` to watch it
live. Follow exits when the job ends, with its state as the exit code: 0 succeeded,
1 failed (or timed out), 2 killed."""

import re
import sys
import time
from datetime import UTC, datetime, timedelta

import click

from lakeshore.client import Client, path
from lakeshore.context import pass_client
from lakeshore.output import echo, json_text

FOLLOW_WAIT = 20  # seconds a follow request waits on the server (the client waits 40)
PAGE_LINES = 1000
EXIT_CODES = {"succeeded": 0, "failed": 1, "timeout": 1, "killed": 2}
ENDED = set(EXIT_CODES)
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def since_param(ctx, param, value: str | None) -> str | None:
    """An ISO 8601 time, or a duration back from now (30s, 10m, 2h, 1d)."""
    if value is None:
        return None
    if found := _RELATIVE.match(value.strip()):
        back = timedelta(**{_UNITS[found.group(2)]: float(found.group(1))})
        return (datetime.now(UTC) - back).isoformat()
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a time (2026-12-04T10:00:00Z) nor a duration (30s, 10m, 2h, 1d)",
            ctx,
            param,
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # the local time zone, as the user typed it
    return moment.isoformat()


@click.command("logs")
@click.argument("job_id", metavar="JOB")
@click.option("--attempt", type=click.IntRange(min=1), help="This attempt (default: the latest).")
@click.option(
    "--follow", "-f", is_flag=True, help="Print lines as they come; exit when the job ends."
)
@click.option(
    "--tail", type=click.IntRange(0, 10_000), help="Only the last N lines (at most 10,000)."
)
@click.option(
    "--since", callback=since_param, help="Lines from this time (ISO 8601) or 30s, 10m, 2h, 1d ago."
)
@click.option("--stream", type=click.Choice(["out", "err"]), help="Only stdout or stderr.")
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object a line (n, at, stream, text)."
)
@pass_client
def logs(client: Client, job_id, attempt, follow, tail, since, stream, as_json) -> None:
    """What job JOB printed (stdout and stderr, in the order its daemon read them).

    With --follow, it prints lines as they come, goes on to the next attempt if the job
    is retried, and exits when the job ends: 0 succeeded, 1 failed, 2 killed."""
    url = path("jobs", job_id, "logs")
    query = {"stream": stream, "since": since, "limit": PAGE_LINES}
    page = client.get(url, attempt=attempt, tail=tail, **query, offset=None if tail else 0)
    said_waiting = False
    while True:
        _print(page["lines"], as_json)
        more = page["next_offset"] < page["total_lines"] and page["lines"]
        if more:
            page = client.get(url, attempt=page["attempt"], offset=page["next_offset"], **query)
            continue
        if not follow:
            return
        if page["complete"] and page["state"] in ENDED:
            sys.exit(EXIT_CODES[page["state"]])
        if page["complete"]:  # this attempt is over; the job goes on
            if attempt is not None:  # the one asked for ended badly: the job is retried
                sys.exit(1)
            click.echo(
                f"[lakeshore] attempt {page['attempt']} ended ({page['state']}); waiting for "
                f"attempt {page['attempt'] + 1}…",
                err=True,
            )
            page = _follow(client, url, page["attempt"] + 1, 0, query)
            continue
        if page["state"] == "queued" and page["attempts"] < page["attempt"] and not said_waiting:
            click.echo(f"[lakeshore] job {job_id} is queued; waiting for it to start…", err=True)
            said_waiting = True
        page = _follow(client, url, page["attempt"], page["next_offset"], query)


def _follow(client: Client, url: str, attempt: int, offset: int, query: dict) -> dict:
    started = time.monotonic()
    page = client.get(url, attempt=attempt, offset=offset, follow=1, wait=FOLLOW_WAIT, **query)
    if not page["lines"] and not page["finished"] and time.monotonic() - started < 0.2:
        time.sleep(1)  # the server could not wait (too many waits at once): wait here
    return page


def _print(lines: list[dict], as_json: bool) -> None:
    for line in lines:
        if as_json:
            click.echo(json_text(line))
        else:
            echo(line["text"])
