"""How results are shown: kubectl-style tables, `key: value` blocks, or the API's JSON."""

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import click

COLUMN_GAP = "   "

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the API's JSON instead of text."
)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def emit(data: Any, as_json: bool, human: Callable[[Any], None]) -> None:
    """The API's JSON with --json, else the human rendering."""
    if as_json:
        print_json(data)
    else:
        human(data)


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Upper-case headers, columns aligned and 3 spaces apart, no borders, no trailing space."""
    lines = [[h.upper() for h in headers]] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    return "\n".join(
        COLUMN_GAP.join(
            value.ljust(width) for value, width in zip(line, widths, strict=True)
        ).rstrip()
        for line in lines
    )


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    click.echo(format_table(headers, rows))


def fields(pairs: Sequence[tuple[str, Any]]) -> None:
    """A `Key: value` block, values aligned."""
    width = max(len(key) for key, _ in pairs) + 1
    for key, value in pairs:
        click.echo(f"{key + ':':<{width}} {cell(value)}".rstrip())


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value).replace("\n", " ")


def when(iso: str | None) -> str:
    """An API timestamp as `2025-01-31T09:05:00Z`: UTC, whole seconds, no spaces."""
    if not iso:
        return "-"
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
