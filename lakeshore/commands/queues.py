"""`lakeshore queues …`: the cookbook's irregular verbs (ls, rm), not list/remove."""

import sys
import time

import click

from lakeshore.client import Client, path
from lakeshore.commands.daemon import print_daemons
from lakeshore.commands.stats import print_ended, window_option
from lakeshore.context import pass_client
from lakeshore.errors import CliError
from lakeshore.output import (
    cell,
    emit,
    fields,
    json_option,
    print_json,
    queue_label,
    table,
    when,
)
from lakeshore.params import HyphenatedChoice, check_name, given, options, reject_option

KINDS = ["fifo", "priority", "boltzmann", "filo"]
STATES = ["active", "draining", "paused", "archived"]
ELASTICITY_KINDS = ["fixed", "fully-elastic", "pool-with-threshold", "max-count"]
ON_FULL = ["reject", "block"]
POLL_SECONDS = 1.0

queue_name = click.argument("name", metavar="NAME")


# --min/--max/--threshold: the numbers of an elasticity declaration (add and patch).
elasticity_options = options(
    click.option(
        "--min", "min_", type=click.IntRange(min=0), help="Fewest daemons (fixed: the count)."
    ),
    click.option("--max", "max_", type=click.IntRange(min=1), help="Most daemons."),
    click.option(
        "--threshold",
        type=click.FloatRange(0.0, 1.0, min_open=True),
        help="Utilisation to stay at or below, 0.0–1.0 (pool-with-threshold).",
    ),
)
backlog_options = options(
    click.option(
        "--max-depth",
        type=click.IntRange(min=1),
        help="Most queued invocations (unbounded if not set).",
    ),
    click.option(
        "--on-full",
        type=click.Choice(ON_FULL),
        help="When the backlog is full: reject (429) or block until there is room.",
    ),
)


def elasticity_text(elasticity: dict | None) -> str:
    """`pool-with-threshold 2..16 @0.7`, `fixed 3`, `fully-elastic 0..unbounded`, or `-`."""
    if not elasticity or not elasticity.get("kind"):
        return "-"
    kind = elasticity["kind"].replace("_", "-")
    low, high = elasticity.get("min"), elasticity.get("max")
    if kind == "fixed":
        return f"{kind} {cell(low)}"
    text = f"{kind} {low or 0}..{'unbounded' if high is None else high}"
    if elasticity.get("threshold") is not None:
        text += f" @{elasticity['threshold']:g}"
    return text


@click.group()
def queues() -> None:
    """Queues: named pipes of pending invocations that daemons subscribe to.

    The verbs are add, ls, show, patch, archive, unarchive, drain, rm, events, stats,
    pause and resume (ls and rm, not list and remove).
    """


@queues.command()
@click.argument("name", metavar="NAME", callback=check_name)
@click.option("--kind", type=click.Choice(KINDS), help="Dispatch order.  [default: fifo]")
@click.option("--description", help="Free text.")
@click.option("--provider", metavar="NAME", help="Provider that launches daemons at scale-up.")
@click.option(
    "--elasticity",
    type=HyphenatedChoice(ELASTICITY_KINDS),
    help="How the daemon count follows the load.",
)
@elasticity_options
@click.option("--instance-type", help="Daemon template: instance type.")
@click.option("--image-id", help="Daemon template: image.")
@click.option("--runner", help="Daemon template: runner.")
@backlog_options
@click.option(
    "--temperature",
    type=click.FloatRange(min=0.0, min_open=True),
    help="boltzmann sampling temperature, above 0.  [default: 1.0]",
)
@json_option
@pass_client
def add(client: Client, name, elasticity, min_, max_, threshold, as_json, **options) -> None:
    """Create a queue."""
    numbers = given(min=min_, max=max_, threshold=threshold)
    if numbers and not elasticity:
        raise click.UsageError(
            "--min/--max/--threshold describe an elasticity declaration: add --elasticity KIND"
        )
    body = {"name": name, **given(**options)}
    if elasticity:
        body["elasticity"] = {"kind": elasticity.replace("-", "_"), **numbers}
    queue = client.post("queues/", json=body)
    emit(queue, as_json, lambda q: click.echo(f"queue/{q.get('name', name)} created"))


@queues.command()
@click.option(
    "--state",
    type=click.Choice(STATES),
    help="Only queues in this state (archived ones are hidden unless asked for).",
)
@json_option
@pass_client
def ls(client: Client, state: str | None, as_json: bool) -> None:
    """List queues."""
    found = client.get_all("queues/", state=state)
    if not found and not as_json:
        click.echo("No queues found.", err=True)
        return
    emit(found, as_json, _print_queues)


def _print_queues(found: list[dict]) -> None:
    table(
        ["NAME", "KIND", "STATE", "MEMBERS", "PROVIDER", "ELASTICITY", "DESCRIPTION"],
        [
            [
                q["name"],
                q.get("kind"),
                q.get("state"),
                q.get("members", 0),
                q.get("provider"),
                elasticity_text(q.get("elasticity")),
                q.get("description"),
            ]
            for q in found
        ],
    )


@queues.command()
@queue_name
@json_option
@pass_client
def show(client: Client, name: str, as_json: bool) -> None:
    """Show one queue and its member daemons."""
    emit(client.get(path("queues", name)), as_json, _print_queue)


def _print_queue(q: dict) -> None:
    fields(
        [
            ("Name", q["name"]),
            ("Kind", q.get("kind")),
            ("State", q.get("state")),
            ("Description", q.get("description")),
            ("Provider", q.get("provider")),
            ("Elasticity", elasticity_text(q.get("elasticity"))),
            ("Instance type", q.get("instance_type")),
            ("Image", q.get("image_id")),
            ("Runner", q.get("runner")),
            ("Max depth", q.get("max_depth") or "unbounded"),
            ("On full", q.get("on_full")),
            ("Temperature", q.get("temperature") if q.get("kind") == "boltzmann" else None),
            ("Members", q.get("members", 0)),
            ("Created", when(q.get("created_at"))),
            ("Updated", when(q.get("updated_at"))),
        ]
    )
    click.echo()
    daemons = q.get("daemons") or []
    if daemons:
        print_daemons(daemons, with_provider=False)
    else:
        click.echo("No member daemons.")


@queues.command()
@queue_name
@click.option("--description", help="Free text.")
@click.option("--provider", metavar="NAME", help='Provider for scale-up; "" clears it.')
@elasticity_options
@backlog_options
@click.option(
    "--dry-run",
    is_flag=True,
    help="Show the desired daemon count under the new numbers; save nothing.",
)
@reject_option("--kind", "queues patch cannot change --kind: a queue's kind is immutable")
@reject_option(
    "--elasticity",
    "queues patch cannot change --elasticity: the elasticity kind is immutable "
    "(--min, --max and --threshold change its numbers)",
)
@json_option
@pass_client
def patch(client: Client, name, min_, max_, threshold, dry_run, as_json, **options) -> None:
    """Change a queue in place (not its kind or elasticity kind)."""
    body = given(**options)
    numbers = given(min=min_, max=max_, threshold=threshold)
    if numbers:
        body["elasticity"] = numbers
    if not body:
        raise click.UsageError(
            "nothing to patch: give at least one of --description, --provider, --min, --max, "
            "--threshold, --max-depth, --on-full"
        )
    queue = client.patch(path("queues", name), json=body, dry_run=dry_run)
    if as_json:
        print_json(queue)
    elif dry_run:
        click.echo(f"dry run: desired daemons would be {queue.get('desired')} (nothing saved)")
    else:
        click.echo(f"queue/{queue.get('name', name)} patched")


def _state_verb(verb: str, summary: str):
    @queues.command(verb, help=summary)
    @queue_name
    @json_option
    @pass_client
    def command(client: Client, name: str, as_json: bool) -> None:
        queue = client.post(path("queues", name, verb))
        emit(queue, as_json, _print_state)

    return command


def _print_state(queue: dict) -> None:
    click.echo(f"queue/{queue['name']} {queue['state']}")


_state_verb("archive", "Archive a queue: it keeps its row but stops accepting work.")
_state_verb("unarchive", "Make a drained, paused or archived queue active again.")
_state_verb("pause", "Pause a queue: it admits work but dispatches none.")
_state_verb("resume", "Make a paused (or draining, or archived) queue active again.")


@queues.command()
@queue_name
@click.option("--wait", is_flag=True, help="Wait until nothing of the queue is queued or running.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="With --wait: give up (exit 1) after this long.",
)
@json_option
@pass_client
def drain(client: Client, name: str, wait: bool, timeout: float | None, as_json: bool) -> None:
    """Stop admitting work; what was admitted still runs and finishes."""
    if timeout is not None and not wait:
        raise click.UsageError("--timeout only applies with --wait")
    queue = client.post(path("queues", name, "drain"))
    emit(queue, as_json, _print_state)
    if wait:
        _wait_drained(client, name, timeout)
        if not as_json:
            click.echo(f"queue/{name} drained")


class Interrupted(CliError):
    exit_code = 130


def _wait_drained(client: Client, name: str, timeout: float | None) -> None:
    """Poll stats each second until pending + running is 0, showing what remains on stderr:
    one updating line on a terminal, a line per change otherwise."""
    on_tty = stderr_is_tty()
    started = time.monotonic()
    shown, first_total = None, 0
    remaining = "unknown"
    try:
        while True:
            stats = client.get(path("queues", name, "stats"))
            queued, running = stats.get("pending", 0), stats.get("running", 0)
            capped = "+" if stats.get("pending_capped") else ""
            remaining = f"{queued}{capped} queued, {running} running"
            first_total = max(first_total, queued + running)
            line = f"draining {name}: {remaining}"
            if on_tty:
                bar = _bar(queued + running, first_total)
                click.echo(f"\r{line}{bar}\033[K", nl=False, err=True)
            elif (queued, running) != shown:
                click.echo(line, err=True)
            shown = (queued, running)
            if queued + running == 0:
                if on_tty:
                    click.echo(err=True)
                return
            if timeout is not None and time.monotonic() - started >= timeout:
                raise CliError(f"queue {name} is not drained after {timeout:g} s ({remaining})")
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        if on_tty:
            click.echo(err=True)
        raise Interrupted(f"interrupted: queue {name} is still draining ({remaining})") from None


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def _bar(left: int, total: int, width: int = 20) -> str:
    done = width * (total - left) // total if total else width
    return f"  [{'#' * done}{'.' * (width - done)}]"


@queues.command()
@queue_name
@click.option(
    "--force",
    is_flag=True,
    help="Remove the queue from every daemon's queues first, and kill its queued invocations.",
)
@json_option
@pass_client
def rm(client: Client, name: str, force: bool, as_json: bool) -> None:
    """Delete a queue (refused while daemons are bound to it, unless --force)."""
    result = client.delete(path("queues", name), force=force)
    if as_json:
        print_json(result if result is not None else {"name": name, "deleted": True})
        return
    done = []
    if (result or {}).get("unbound_daemons"):
        done.append(f"unbound from {result['unbound_daemons']} daemon(s)")
    if (result or {}).get("killed"):
        done.append(f"{result['killed']} queued invocation(s) killed")
    click.echo(f"queue/{name} deleted" + (f" ({', '.join(done)})" if done else ""))


@queues.command()
@queue_name
@click.option("--verbose", is_flag=True, help="Also show tick_noop rows.")
@click.option(
    "--limit",
    type=click.IntRange(1, 200),
    default=50,
    show_default=True,
    help="How many events, 1–200.",
)
@json_option
@pass_client
def events(client: Client, name: str, verbose: bool, limit: int, as_json: bool) -> None:
    """The elasticity audit trail: one row per controller decision, newest first.
    NAME "" is the default queue (it has none: the controller never acts on it)."""
    found = client.get(path("queues", _readable(name), "events"), limit=limit, verbose=verbose)
    if as_json:
        print_json(found)
    elif not found:
        hidden = "" if verbose else " (tick_noop rows are hidden; --verbose shows them)"
        click.echo(f"No events{hidden}.", err=True)
    else:
        print_events(found)


def print_events(found: list[dict]) -> None:
    table(
        ["AT", "ACTION", "D", "B", "P", "U", "DESIRED", "DELTA", "REASON"],
        [
            [
                when(e.get("at")),
                e.get("action"),
                e.get("daemons"),
                e.get("busy"),
                e.get("pending"),
                _ratio(e.get("utilization")),
                e.get("desired"),
                _delta(e.get("delta")),
                e.get("reason"),
            ]
            for e in found
        ],
    )


@queues.command()
@queue_name
@window_option
@json_option
@pass_client
def stats(client: Client, name: str, window: str, as_json: bool) -> None:
    """What the controller sees now, what its next tick would do, and what ended lately
    (counts, rates, wait and run times, the top errors). NAME "" is the default queue."""
    answer = client.get(path("queues", _readable(name), "stats"), window=window)
    emit(answer, as_json, _print_stats)


def _readable(name: str) -> str:
    """A queue to read (stats, events): '' (or '(default)', as `jobs list` shows it) is
    the default queue, which has no name."""
    return queue_label(name)  # the default queue where the API's address needs a name


def _print_stats(s: dict) -> None:
    fields(
        [
            ("Daemons", s.get("daemons")),
            ("Busy", s.get("busy")),
            ("Idle", s.get("idle")),
            ("Provisioning", s.get("provisioning")),
            ("Utilization", _ratio(s.get("utilization"))),
            ("Pending", f"{s.get('pending')}{'+' if s.get('pending_capped') else ''}"),
            ("Running", s.get("running")),
            ("Desired", s.get("desired")),
            ("Next action", s.get("next_action")),
        ]
    )
    click.echo()
    recent = s.get("recent_actions") or []
    if recent:
        click.echo("Recent actions:")
        print_events(recent)
    else:
        click.echo("No recent scale actions.")
    print_ended(s)


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _delta(value) -> str:
    return f"{value:+d}" if value else "0"
