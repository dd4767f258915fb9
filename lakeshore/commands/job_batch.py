"""`lakeshore jobs submit FUNCTION --batch FILE`: many invocations from JSON lines.

Each line is one object, `{"args": [1], "kwargs": {"x": 2}, "key": "k", "priority": 5}`,
every member optional and no other allowed; a blank line is skipped (it still counts
in the line numbers). The command's flags (--queue, --timeout, --max-attempts, and
--priority for a line without one) apply to every line. The lines go to the batch API
(POST jobs/ with a list) in chunks that stay within the server's default bounds, and
the server takes each chunk whole or not at all.

A file is read twice: once to check every line, so that a bad line anywhere queues
nothing, then to send it. Standard input (or a pipe named as a file) is read once,
each chunk checked whole before it is sent: a bad line then stops the run after the
chunks before it, and the error says which lines were queued and where to resume.
One chunk is held at a time, whatever the input's size."""

import json
import math
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import IO, Any

import click

from lakeshore.client import Client
from lakeshore.commands.apply import STDIN_LABEL
from lakeshore.errors import ApiError, CliError
from lakeshore.output import echo, print_json, queue_label

LINE_MEMBERS = ("args", "kwargs", "key", "priority")
CHUNK_MAX_LINES = 10_000  # the server's bound on a batch (jobs/services.BATCH_SUBMIT_MAX)
CHUNK_MAX_BYTES = 8 * 1024 * 1024  # a body under the server's default 10 MiB
CHUNK_MAX_VALUES = 250_000  # half the server's default LAKESHORE_JSON_MAX_VALUES
LINE_MAX_BYTES = CHUNK_MAX_BYTES

# The API's fields that come from the command's flags, not from a line: a refusal of
# one of them is said once, by its flag, not at every line.
FLAG_FIELDS = {
    "function": "FUNCTION",
    "queue": "--queue",
    "timeout_s": "--timeout",
    "max_attempts": "--max-attempts",
}
ITEM_FIELD = re.compile(r"^(\d+)(?:\.(.*))?$")  # `3.kwargs`: the 4th item's kwargs
RESUME = "a key on each line makes a re-run safe"


@dataclass(frozen=True)
class Submission:
    """What every line gets from the command's flags."""

    function: str
    queue: str
    priority: float
    timeout_s: int | None
    max_attempts: int


class BadLine(CliError):
    """A line refused before its chunk is sent, named by its number."""


@dataclass
class Chunk:
    """Lines sent in one request: each line's number and its item, encoded as JSON."""

    numbers: list[int] = field(default_factory=list)
    items: list[bytes] = field(default_factory=list)
    size: int = 2  # the list's brackets
    values: int = 0

    def fits(self, item: bytes, values: int, max_lines: int) -> bool:
        """Room for one more item (an empty chunk always takes one: the server judges it)."""
        return not self.items or (
            len(self.items) < max_lines
            and self.size + len(item) + 1 <= CHUNK_MAX_BYTES
            and self.values + values <= CHUNK_MAX_VALUES
        )

    def add(self, number: int, item: bytes, values: int) -> None:
        self.numbers.append(number)
        self.items.append(item)
        self.size += len(item) + 1
        self.values += values

    def body(self) -> bytes:
        return b"[" + b",".join(self.items) + b"]"


@dataclass
class Tally:
    """What the chunks sent so far did: how many lines queued a new invocation, how many
    found one by its key, the range of the new ids, and the last line they cover."""

    queued: int = 0
    existing: int = 0
    first_id: int | None = None
    last_id: int | None = None
    through_line: int = 0
    hint: str = ""

    def count(self, answers: list[dict], chunk: Chunk) -> None:
        for answer in answers:
            if answer.get("created", True):
                self.queued += 1
                made = int(answer["id"])
                self.first_id = made if self.first_id is None else min(self.first_id, made)
                self.last_id = made if self.last_id is None else max(self.last_id, made)
            else:
                self.existing += 1
        self.through_line = chunk.numbers[-1]
        self.hint = answers[-1].get("hint") or ""

    def resume(self) -> str:
        """Where a run that stopped here should go on."""
        if not self.through_line:
            return "nothing was queued"
        return (
            f"lines 1 to {self.through_line} were queued, nothing after: resume from line "
            f"{self.through_line + 1} ({RESUME})"
        )

    def unsure(self, chunk: Chunk) -> str:
        """Where to go on when a chunk got no answer: it may have been queued."""
        first, last = chunk.numbers[0], chunk.numbers[-1]
        done = f"lines 1 to {self.through_line} were queued; " if self.through_line else ""
        return (
            f"{done}lines {first} to {last} may have been queued or not (no answer came): "
            f"resume from line {first} ({RESUME})"
        )


# ---------------------------------------------------------------------------- reading


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is too large for a number")
    return number


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _members(pairs: list[tuple[str, Any]]) -> dict:
    made = dict(pairs)
    if len(made) != len(pairs):
        twice = next(name for name, seen in Counter(name for name, _ in pairs).items() if seen > 1)
        raise ValueError(f"the name {twice!r} is given twice in one object: give it once")
    return made


# json.loads would take NaN, Infinity and 1e400, which are not JSON numbers, and keep
# the last of a name given twice: refused here, at their line.
_DECODER = json.JSONDecoder(
    object_pairs_hook=_members, parse_float=_finite, parse_constant=_no_constant
)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_KINDS: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "true or false",
    int: "a number",
    float: "a number",
    type(None): "null",
}
_WANTED = (
    ("args", list, "a JSON array"),
    ("kwargs", dict, "a JSON object"),
    ("key", str, "a string"),
)


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def line_object(line: bytes) -> dict:
    """The line's object, checked; a ValueError says what is wrong with it."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start + 1})") from None
    try:
        value = _DECODER.decode(text.removeprefix("\ufeff"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg}, column {exc.colno})") from None
    except RecursionError:
        raise ValueError("not JSON that can be read (nested too deeply)") from None
    if not isinstance(value, dict):
        raise ValueError(f'must be a JSON object such as {{"args": [1]}}, not {_kind(value)}')
    for name in value:
        if name not in LINE_MEMBERS:
            raise ValueError(f"unknown key {name!r} (a line takes {', '.join(LINE_MEMBERS)})")
    for name, wanted, shown in _WANTED:
        if name in value and not isinstance(value[name], wanted):
            raise ValueError(f"{name} must be {shown}, not {_kind(value[name])}")
    priority = value.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int | float):
        raise ValueError(f"priority must be a number, not {_kind(priority)}")
    return value


def json_values(encoded: bytes) -> int:
    """How many values compact JSON holds: each array's items and each object's members,
    nested ones included, as the server counts them (lakeshore_admin/parsers.py): the
    commas outside strings, plus one for each container that is not empty."""
    skeleton = _STRING.sub(b"0", encoded)
    containers = skeleton.count(b"[") + skeleton.count(b"{")
    return skeleton.count(b",") + containers - skeleton.count(b"[]") - skeleton.count(b"{}")


def encoded_item(value: dict, submission: Submission) -> tuple[bytes, int]:
    """The API's item for a line's object, as JSON, and how many values it holds."""
    item = {
        "function": submission.function,
        "queue": submission.queue,
        "args": value.get("args", []),
        "kwargs": value.get("kwargs", {}),
        "key": value.get("key", ""),
        "priority": value.get("priority", submission.priority),
        "timeout_s": submission.timeout_s,
        "max_attempts": submission.max_attempts,
    }
    try:
        encoded = _ENCODER.encode(item).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("holds a \\u escape of half a surrogate pair, which is not text") from None
    return encoded, json_values(encoded) + 1  # and its place in the batch's list


def numbered_lines(stream: IO[bytes], label: str) -> Iterator[tuple[int, bytes]]:
    """Each line that is not blank, with its number (from 1)."""
    number = 0
    while True:
        try:
            raw = stream.readline(LINE_MAX_BYTES + 1)
        except OSError as exc:
            raise CliError(f"cannot read {label}: {exc.strerror or exc}") from exc
        if not raw:
            return
        number += 1
        line = raw.rstrip(b"\r\n")
        if len(line) > LINE_MAX_BYTES:
            raise BadLine(
                f"{label}:{number}: longer than {LINE_MAX_BYTES // (1024 * 1024)} MiB "
                "(a request body is at most 10 MiB)"
            )
        if line.strip():
            yield number, line


def chunks(
    stream: IO[bytes], label: str, submission: Submission, max_lines: int
) -> Iterator[Chunk]:
    """The lines, checked, in chunks of at most `max_lines` lines, CHUNK_MAX_BYTES and
    CHUNK_MAX_VALUES. A chunk is given only once all its lines passed."""
    chunk = Chunk()
    for number, line in numbered_lines(stream, label):
        try:
            item, values = encoded_item(line_object(line), submission)
        except ValueError as exc:
            raise BadLine(f"{label}:{number}: {exc}") from None
        if not chunk.fits(item, values, max_lines):
            yield chunk
            chunk = Chunk()
        chunk.add(number, item, values)
    if chunk.items:
        yield chunk


# ---------------------------------------------------------------------------- sending


def post(client: Client, chunk: Chunk, label: str, tally: Tally) -> None:
    """Send one chunk and count what the server did with it."""
    try:
        answers = client.decode(client.send("POST", "jobs/", content=chunk.body()))
    except ApiError as error:
        raise refused(error, chunk, label, tally) from error
    except CliError as error:  # no answer: the chunk may or may not have been queued
        error.hint = tally.unsure(chunk)
        raise
    if not isinstance(answers, list) or len(answers) != len(chunk.numbers):
        raise CliError(
            f"the server answered a batch of {len(chunk.numbers):,} with something else "
            f"than {len(chunk.numbers):,} invocations",
            hint=tally.unsure(chunk),
        )
    tally.count(answers, chunk)


def refused(error: ApiError, chunk: Chunk, label: str, tally: Tally) -> ApiError:
    """The server's refusal of a chunk with where to resume: each item's error at its
    line, a flag's once by its flag, and a refusal of the whole chunk (a full queue)
    with the chunk's lines. It keeps the server's status and code."""
    at_lines: dict[str, None] = {}  # in order, once each
    by_flag: dict[str, None] = {}
    for name, message in error.fields.items():
        item = ITEM_FIELD.match(name)
        member = (item.group(2) or "") if item else name
        flag = FLAG_FIELDS.get(re.split(r"[.\[]", member, maxsplit=1)[0])
        if flag is not None or item is None:
            by_flag[f"{flag or member}: {message}"] = None
        elif int(item.group(1)) < len(chunk.numbers):
            where = f"{label}:{chunk.numbers[int(item.group(1))]}"
            at_lines[f"{where}: {member}: {message}" if member else f"{where}: {message}"] = None
    lines = [*at_lines, *by_flag]
    if at_lines and (more := error.detail.get("more_errors")):
        lines.append(f"and {more:,} more errors")
    only_lists_them = error.code == "invalid" and all(
        message in error.message for message in error.fields.values()
    )
    if not lines or not only_lists_them:
        first, last = chunk.numbers[0], chunk.numbers[-1]
        lines.insert(0, f"{label}:{first}-{last}: {error.message}")
    located = ApiError(error.status, error.code, "\n  ".join(lines), detail=error.detail)
    located.hint = "\n".join(hint for hint in (error.hint, tally.resume()) if hint)
    return located


# ---------------------------------------------------------------------------- the command


def progress(label: str, length: int | None, *, show_pos: bool):
    """A bar on stderr, only when stderr is a terminal. Without a length (standard
    input) it shows a moving mark and the count."""
    return click.progressbar(
        iter(int, 1) if length is None else None,  # an iterable of no length; never read
        length=length,
        label=label,
        file=sys.stderr,
        hidden=not sys.stderr.isatty(),
        show_pos=show_pos,
        show_percent=length is not None,
    )


def submit_lines(
    client: Client, source: str, submission: Submission, *, as_json: bool, max_lines: int
) -> None:
    """Queue every line of `source` ('-': standard input) and print the summary."""
    started = time.monotonic()
    label = STDIN_LABEL if source == "-" else source
    tally = Tally()
    if source != "-" and os.path.isfile(source):
        total = _check_whole(source, label, submission, max_lines)
        with _opened(source, label) as stream:
            _send(client, chunks(stream, label, submission, max_lines), label, tally, total)
    else:
        with _opened(source, label) as stream:
            _send(client, chunks(stream, label, submission, max_lines), label, tally, None)
    seconds = time.monotonic() - started
    if as_json:
        print_json(
            {
                "queue": submission.queue,
                "queued": tally.queued,
                "existing": tally.existing,
                "first_id": None if tally.first_id is None else str(tally.first_id),
                "last_id": None if tally.last_id is None else str(tally.last_id),
                "seconds": round(seconds, 3),
            }
        )
    else:
        click.echo(summary_line(tally, submission.queue, seconds))
    if tally.hint:  # nothing serves the queue: the server says how to start a daemon
        echo(f"note: {tally.hint}", err=True)


def summary_line(tally: Tally, queue: str, seconds: float) -> str:
    """How many lines were queued, how many found their key's job already there, in
    which queue, and how long the run took."""
    existing = f", {tally.existing:,} already existed (same key)" if tally.existing else ""
    return f"{tally.queued:,} queued{existing} in {queue_label(queue)} in {seconds:.1f} s"


def _opened(source: str, label: str):
    if source == "-":
        return nullcontext(sys.stdin.buffer)
    try:
        return open(source, "rb")  # noqa: SIM115 - the caller's with closes it
    except OSError as exc:
        raise CliError(f"cannot read {label}: {exc.strerror or exc}") from exc


def _check_whole(source: str, label: str, submission: Submission, max_lines: int) -> int:
    """Every line of a file checked before any is sent; how many lines it holds."""
    total = 0
    with (
        _opened(source, label) as stream,
        progress("checking", os.path.getsize(source), show_pos=False) as bar,
    ):
        try:
            for chunk in chunks(stream, label, submission, max_lines):
                total += len(chunk.numbers)
                bar.update(stream.tell() - bar.pos)
        except BadLine as error:
            error.hint = f"nothing was queued ({label} is checked whole before a line is sent)"
            raise
    return total


def _send(
    client: Client, lines: Iterator[Chunk], label: str, tally: Tally, total: int | None
) -> None:
    with progress("queueing", total, show_pos=True) as bar:
        try:
            for chunk in lines:
                post(client, chunk, label, tally)
                bar.update(len(chunk.numbers))
        except CliError as error:  # a bad line, or the input could not be read
            error.hint = error.hint or tally.resume()
            raise
