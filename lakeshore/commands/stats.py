"""`lakeshore stats`: every queue at once; and what ended in a window, as `queues stats`
and `stats` print it."""

import click

from lakeshore.client import Client
from lakeshore.context import pass_client
from lakeshore.output import emit, fields, json_option, table, when

WINDOWS = ["1h", "24h"]
BLOCKS = {"last_hour": "Last hour", "last_day": "Last day"}
ENDED = ["succeeded", "failed", "killed", "timeout"]

window_option = click.option(
    "--window",
    type=click.Choice(WINDOWS),
    default="1h",
    show_default=True,
    help="What ended in the last hour or the last day.",
)


@click.command()
@window_option
@json_option
@pass_client
def stats(client: Client, window: str, as_json: bool) -> None:
    """Every queue at once: live daemons, what waits and runs, and what ended lately
    (counts, rates, wait and run times, the top errors)."""
    emit(client.get("stats/", window=window), as_json, print_fleet)


def print_fleet(s: dict) -> None:
    fields(
        [
            ("Queues", s.get("queues")),
            ("Daemons", s.get("daemons")),
            ("Busy", s.get("busy")),
            ("Idle", s.get("idle")),
            ("Provisioning", s.get("provisioning")),
            ("Pending", f"{s.get('pending')}{'+' if s.get('pending_capped') else ''}"),
            ("Running", f"{s.get('running')}{'+' if s.get('running_capped') else ''}"),
        ]
    )
    print_ended(s)


def print_ended(s: dict) -> None:
    """The window's block of a stats answer (last_hour or last_day), if it has one."""
    for key, title in BLOCKS.items():
        block = s.get(key)
        if block is not None:
            click.echo()
            click.echo(f"{title} (since {when(block.get('since'))}):")
            _print_block(block)


def _print_block(block: dict) -> None:
    rates = block.get("per_minute") or {}
    fields(
        [
            *(
                (state.capitalize(), f"{block.get(state)} ({rate(rates.get(state))}/min)")
                for state in ENDED
            ),
            ("Waited", spread(block.get("wait_ms"))),
            ("Ran", spread(block.get("run_ms"))),
        ]
    )
    errors = block.get("errors") or []
    click.echo()
    if not errors:
        click.echo("No errors.")
        return
    click.echo("Top errors:")
    table(
        ["count", "last job", "error"],
        [(e.get("count"), e.get("last_job"), e.get("error")) for e in errors],
    )


def rate(per_minute) -> str:
    """0.07, 12.5, 0: no trailing zeros."""
    return "-" if per_minute is None else f"{per_minute:g}"


def spread(ms: dict | None) -> str:
    """p50, p95 and max of a duration in milliseconds, as people read them."""
    if not ms or ms.get("max") is None:
        return "-"
    return "   ".join(f"{name} {duration(ms.get(name))}" for name in ("p50", "p95", "max"))


def duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(round(ms / 1000), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
