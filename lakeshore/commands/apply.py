"""`lakeshore apply -f lakeshore.yaml` and `lakeshore export`: providers and queues as code.

The server plans and applies (POST apply/, GET export/); this side reads the file with
its line numbers, so that every error the server names by path (`queues[1].kind`)
is shown at its line: `lakeshore.yaml:14: queues[1].kind: ...`."""

import json
import math
import re
import sys
from collections import Counter

import click
import yaml

from lakeshore.client import Client
from lakeshore.context import pass_client
from lakeshore.errors import ApiError, CliError
from lakeshore.output import echo, json_option, print_json

SECTIONS = ("providers", "queues")
STDIN_LABEL = "<stdin>"


class Document:
    """The parsed file: its data, and the line of every path in it (1-based)."""

    def __init__(self, label: str, data: dict, lines: dict[str, int]):
        self.label, self.data, self.lines = label, data, lines

    def at(self, path: str) -> str:
        """`lakeshore.yaml:14` for a path, or its nearest enclosing path that the file has."""
        while path:
            if path in self.lines:
                return f"{self.label}:{self.lines[path]}"
            parent = re.sub(r"(\.[^.\[\]]*|\[\d+\])$", "", path)
            if parent == path:
                break
            path = parent
        return self.label

    def error(self, path: str, message: str) -> CliError:
        return CliError(f"{self.at(path)}: {path}: {message}")


def read_document(source: str) -> Document:
    label = STDIN_LABEL if source == "-" else source
    try:
        if source == "-":
            text = sys.stdin.read()
        else:
            with open(source, encoding="utf-8") as handle:
                text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CliError(f"cannot read {label}: {reason}") from exc
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else {}
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{label}:{mark.line + 1}" if mark else label
        problem = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise CliError(f"{where}: invalid YAML: {problem or exc}") from exc
    except yaml.YAMLError as exc:
        raise CliError(f"{label}: invalid YAML: {exc}") from exc
    finally:
        loader.dispose()
    if node is None:
        raise CliError(
            f"{label} is empty: declare providers: and queues: ('lakeshore export' writes "
            "today's as a starting point)"
        )
    if not isinstance(node, yaml.MappingNode):
        raise CliError(
            f"{label}:{node.start_mark.line + 1}: the top level must be a mapping with "
            "providers: and queues:, not a list or a single value"
        )
    lines: dict[str, int] = {}
    document = Document(label, data, lines)
    _locate(node, "", lines, document, set())
    for key in data:
        if key not in SECTIONS:
            raise document.error(str(key), "unknown key (known: providers, queues)")
    _check_json(data, "", document)
    return document


def _locate(node, path: str, lines: dict, document: Document, seen: set) -> None:
    """Fill `lines` with each key's line and each list item's first line; refuse a key
    given twice in one mapping (YAML would silently keep the last)."""
    if id(node) in seen:  # an alias that contains itself
        return
    seen = seen | {id(node)}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            child = f"{path}.{key}" if path else key
            if child in lines:
                raise CliError(
                    f"{document.label}:{key_node.start_mark.line + 1}: {child}: given twice "
                    f"(first on line {lines[child]}): give each key once"
                )
            lines[child] = key_node.start_mark.line + 1
            _locate(value_node, child, lines, document, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = f"{path}[{index}]"
            lines[child] = item.start_mark.line + 1
            _locate(item, child, lines, document, seen)


def _check_json(value, path: str, document: Document) -> None:
    """The document goes to the server as JSON: refuse what JSON cannot carry (a date,
    a non-string key, .inf), at its line."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if not isinstance(key, str):
                raise document.error(path or str(key), f"the key {key!r} must be a string")
            _check_json(inner, f"{path}.{key}" if path else key, document)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            _check_json(inner, f"{path}[{index}]", document)
    elif isinstance(value, float) and not math.isfinite(value):
        raise document.error(path, f"{value} is not a number JSON can carry")
    elif value is not None and not isinstance(value, str | int | float | bool):
        raise document.error(
            path, f"{value} reads as a {type(value).__name__}, not text: put it in quotes"
        )


def _located(error: ApiError, document: Document) -> CliError:
    """The server's refusal, each field at its line of the file."""
    lines = [
        f"{document.at(path)}: {message}"
        if path in ("", "__all__")
        else f"{document.at(path)}: {path}: {message}"
        for path, message in error.fields.items()
    ]
    only_lists_them = error.code == "invalid" and all(
        message in error.message for message in error.fields.values()
    )
    if not lines or not only_lists_them:
        lines.append(error.message if lines else f"{document.label}: {error.message}")
    return CliError(
        "\n  ".join(lines),
        hint=f"nothing was changed ({document.label} is applied whole or not at all)",
    )


@click.command()
@click.option(
    "-f",
    "--filename",
    "source",
    required=True,
    metavar="FILE",
    help="The lakeshore.yaml to apply ('-' reads standard input).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option(
    "--prune",
    is_flag=True,
    help="Also remove the queues, then the providers, that the file does not declare. "
    "If 'rm' would refuse one (in use), the plan is printed with the refusals and "
    "nothing changes (exit 1).",
)
@json_option
@pass_client
def apply(client: Client, source: str, dry_run: bool, prune: bool, as_json: bool) -> None:
    """Make providers and queues as lakeshore.yaml declares them, all or nothing.

    The file lists `providers:` (name, kind, description, config) and `queues:` (name,
    kind, description, provider, elasticity {kind, min, max, threshold}, instance_type,
    image_id, runner, max_depth, on_full, temperature), with the API's field names and
    underscored elasticity kinds (pool_with_threshold). A field the file leaves out is
    left alone (its default on create). A kind cannot change: remove and re-create.
    """
    document = read_document(source)
    body = {"document": document.data, "dry_run": dry_run, "prune": prune}
    try:
        result = client.post("apply/", json=body)
    except ApiError as error:
        if error.code == "apply_refused" and isinstance(error.detail.get("items"), list):
            raise _refused_plan(error, as_json) from error
        if error.code == "apply_in_progress":  # not the file's fault: no line to show
            raise CliError(
                error.message,
                hint="another 'lakeshore apply' is running on the server: run this one again "
                "when it ends",
            ) from error
        if error.status in (400, 404, 409):
            raise _located(error, document) from error
        raise
    if as_json:
        print_json(result)
        return
    for item in result["items"]:
        echo(item_line(item))
    click.echo(summary_line(result))


def _refused_plan(error: ApiError, as_json: bool) -> CliError:
    """A plan with a refused removal: the whole plan, each refusal on its item's line,
    then the error (exit 1). Nothing was changed."""
    if as_json:
        print_json({"error": error.detail})
    else:
        result = {"dry_run": bool(error.detail.get("dry_run")), "items": error.detail["items"]}
        for item in result["items"]:
            echo(item_line(item))
        click.echo(summary_line(result))
    return CliError(error.message)


def item_line(item: dict) -> str:
    """`queue/train: update (description: "a" → "b", elasticity.max: 4 → 8)`, and
    `queue/old: delete — refused: <why> (queue_in_use)`."""
    line = f"{item['type']}/{item['name']}: {item['action']}"
    if item["action"] == "update":
        changes = ", ".join(
            f"{field}: {_shown(change['old'])} → {_shown(change['new'])}"
            for field, change in item["changes"].items()
        )
        line += f" ({changes})"
    if refused := item.get("refused"):
        line += f" — refused: {refused['message']} ({refused['code']})"
    return line


def summary_line(result: dict) -> str:
    count = Counter(item["action"] for item in result["items"])
    refused = sum(1 for item in result["items"] if item.get("refused"))
    planned = (
        f"{count['create']} to create, {count['update']} to update, {count['delete']} to "
        f"delete{f' ({refused} refused)' if refused else ''}, {count['unchanged']} unchanged"
    )
    if refused:
        if result.get("dry_run"):
            return f"Plan: {planned} (dry run: nothing changed)"
        return f"Refused: {planned}; nothing was changed."
    if result["up_to_date"]:
        return "Up to date: nothing to change."
    if result.get("dry_run"):
        return f"Plan: {planned} (dry run: nothing changed)"
    return (
        f"Applied: {count['create']} created, {count['update']} updated, "
        f"{count['delete']} deleted, {count['unchanged']} unchanged."
    )


def _shown(value) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


@click.command()
@json_option
@pass_client
def export(client: Client, as_json: bool) -> None:
    """Print every provider and queue as a lakeshore.yaml (every field)."""
    document = client.get("export/")
    if as_json:
        print_json(document)
        return
    text = yaml.dump(
        document,
        Dumper=_IndentedDumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
    )
    click.echo(text, nl=False)


class _IndentedDumper(yaml.SafeDumper):
    """Lists indented under their key (`queues:` then `  - name: train`), as people write."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)
