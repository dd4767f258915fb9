"""How results are shown: kubectl-style tables, `key: value` blocks, or the API's JSON.

Text a job or a daemon wrote (a log line, an error, a reason, a name) reaches the
reader's terminal only through `visible`: a control character is shown as `cat -v`
shows it (ESC as ^[, CR as ^M, DEL as ^?, a C1 control as M-^[), so no job can clear the
screen, set the clipboard (OSC 52) or rewrite what was printed before. JSON keeps the
exact text: its string escapes carry every character, the C1 controls and DEL too."""

import json
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import click

COLUMN_GAP = "   "

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the API's JSON instead of text."
)


# C0 controls but newline and tab, DEL, and the C1 controls (a UTF-8 terminal acts on
# U+009B as on ESC [): what `visible` spells out.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_JSON_RAW = re.compile("[\x7f-\x9f]")  # json.dumps escapes the C0 controls itself


def _caret(found: re.Match) -> str:
    code = ord(found.group())
    high, code = ("M-", code - 0x80) if code >= 0x80 else ("", code)
    return high + ("^?" if code == 0x7F else f"^{chr(code + 64)}")


def visible(text: str) -> str:
    """`text` with its control characters in caret notation (as `cat -v` shows them);
    newlines and tabs stay as they are."""
    return _CONTROLS.sub(_caret, text)


def echo(text: str, *, err: bool = False) -> None:
    """Print text that came from the server (a job's words among it), made `visible`."""
    click.echo(visible(text), err=err)


def json_text(data: Any, *, indent: int | None = None) -> str:
    """The API's JSON as text: exact (every string decodes to what the server sent), and
    safe on a terminal (DEL and the C1 controls as \\u escapes, as the C0 ones are)."""
    text = json.dumps(data, indent=indent, ensure_ascii=False)
    return _JSON_RAW.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


def print_json(data: Any) -> None:
    click.echo(json_text(data, indent=2))


DEFAULT_QUEUE_LABEL = "(default)"  # as the console and the server's pages name it


def queue_label(name: str | None) -> str:
    """A queue's name, or "(default)" for the default queue (the API's "")."""
    return name or DEFAULT_QUEUE_LABEL


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
    return visible(str(value).replace("\n", " "))


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
