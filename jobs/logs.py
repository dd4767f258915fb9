"""Per-job logs: what a job printed, per attempt, shipped by the daemon that holds the
attempt (POST /api/v1/daemons/<id>/logs/) and read by the CLI, the API and the console
(GET /api/v1/jobs/<id>/logs/).

Stored in PostgreSQL, one JobLog row an attempt (its totals) and LogChunk rows (its
lines as the daemon batched them): a log is read from where the last read stopped, by
line number, with the job's own rows, swept by retention with its invocation, and
needs no file shared between the server and the hosts daemons run on.

Bounds. A shipment holds at most CHUNKS_MAX chunks of at most CHUNK_MAX_LINES lines of
at most LINE_MAX_BYTES each (the daemon splits a longer line). An attempt keeps at most
LAKESHORE_LOG_MAX_BYTES in at most LAKESHORE_LOG_MAX_ROWS rows: the first half (the
head) and the last half (the tail) of each, the oldest rows of the tail cut as new ones
come. A shipment's lines are joined to the attempt's last row while it is small (a
daemon that ships a line at a time fills a row, not a row a line); a chunk after lines
the daemon dropped starts a row (its marker's place), so the rows bound is what holds
a daemon that says it dropped lines before every line. A read answers at most READ_MAX_LINES
lines and about READ_MAX_BYTES, and sleeps (follow) at most FOLLOW_MAX_SECONDS, with a
slot of jobs/waits.py.

Fencing. Only the daemon that holds the attempt writes it: the invocation's daemon and
attempt must be the chunk's (so a late flush of an attempt that just ended is kept, and
nothing of a daemon the attempt was taken from is). Each chunk carries the daemon's own
number (seq): one already stored is a duplicate, so a shipment sent again after a lost
answer stores nothing twice. An attempt's log closes LAKESHORE_LOG_APPEND_GRACE_SECONDS
after the attempt ended (its daemon ships the last lines before it reports the end):
lines for it after that are refused, 409 log_closed."""

import time
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from jobs import services, waits, wakeup
from jobs.log_rows import CHUNK_MAX_LINES, KeptRows, cut_tail
from jobs.models import TERMINAL_STATES, Invocation, InvocationState, JobLog, LogChunk
from lakeshore_admin.errors import Conflict, Invalid, NotFound

LINE_MAX_BYTES = 16 * 1024
CHUNKS_MAX = 100
READ_MAX_LINES = 10_000
READ_DEFAULT_LINES = 1000
READ_MAX_BYTES = 1024 * 1024
FOLLOW_MAX_SECONDS = 30
STREAMS = {"o": "out", "e": "err"}
STREAM_LETTERS = {name: letter for letter, name in STREAMS.items()}
CUT = "cut"  # a marker line's stream: where the middle of a long log was cut
DROPPED = "dropped"  # a marker line's stream: lines the daemon could not keep
_READ_FIELDS = ("pk", "state", "attempts")  # what a read needs of its invocation


# ---------------------------------------------------------------------------- writing


def checked_lines(lines, where: str) -> list:
    """A chunk's lines as [stream letter, epoch seconds, text], or Invalid saying which
    line is wrong and why (PostgreSQL stores no NUL; text must be valid Unicode)."""
    if not isinstance(lines, list) or not 1 <= len(lines) <= CHUNK_MAX_LINES:
        raise Invalid(f"{where}: lines must be a list of 1 to {CHUNK_MAX_LINES:,} lines.")
    for i, line in enumerate(lines):
        problem = _line_problem(line)
        if problem:
            raise Invalid(f"{where}, line {i}: {problem}.", fields={"lines": "invalid"})
    return lines


def _line_problem(line) -> str | None:
    if not isinstance(line, list) or len(line) != 3:
        return "a line is [stream, time, text]"
    stream, at, text = line
    if stream not in STREAMS:
        return "its stream must be 'o' (stdout) or 'e' (stderr)"
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not 0 <= at < 2**33:
        return "its time must be seconds since the epoch"
    if not isinstance(text, str):
        return "its text must be a string"
    if "\n" in text or "\x00" in text:
        return "its text may hold no newline and no NUL character"
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        return "its text is not valid Unicode"
    if size > LINE_MAX_BYTES:
        return f"its text is {size:,} bytes (at most {LINE_MAX_BYTES:,}: split longer lines)"
    return None


def ship(*, daemon_id: int, chunks: list[dict]) -> list[dict]:
    """Store each chunk of an attempt this daemon holds. A chunk: invocation, attempt,
    seq, lines ([stream letter, epoch seconds, text], in the order read), dropped (lines
    lost on the daemon before these). Answers, per chunk, stored, duplicate or stale
    (the daemon does not hold that attempt: nothing stored). A shipment holding a chunk
    of an attempt that ended more than LAKESHORE_LOG_APPEND_GRACE_SECONDS ago is refused
    whole (409 log_closed, naming those attempts; nothing stored). One transaction and a
    few statements for the whole shipment, however many chunks it holds."""
    if len(chunks) > CHUNKS_MAX:
        raise Invalid(f"a shipment holds at most {CHUNKS_MAX} chunks.")
    answers = []
    with transaction.atomic():
        rows = Invocation.objects.filter(
            pk__in={chunk["invocation"] for chunk in chunks}, daemon_id=daemon_id
        ).values("pk", "attempts", "state", "finished_at", "scheduled_at")
        held = {(row["pk"], row["attempts"]): row for row in rows}
        _refuse_closed({_key(chunk) for chunk in chunks} & set(held), held)
        keys = sorted({key for chunk in chunks if (key := _key(chunk)) in held})
        logs = _locked_logs(keys)
        kept = KeptRows(logs)
        for chunk in chunks:
            key = _key(chunk)
            if key not in held:
                status = "stale"
            elif chunk["seq"] < logs[key].next_seq:
                status = "duplicate"
            else:
                _append(logs[key], chunk, kept)
                status = "stored"
            answers.append(
                {"invocation": key[0], "attempt": key[1], "seq": chunk["seq"], "status": status}
            )
        kept.save()
        half = settings.LAKESHORE_LOG_MAX_BYTES // 2
        rows_half = settings.LAKESHORE_LOG_MAX_ROWS // 2
        for log in logs.values():
            cut_tail(log, half, rows_half)  # only a log past a tail's half does anything
            log.updated_at = timezone.now()
        JobLog.objects.bulk_update(list(logs.values()), _LOG_FIELDS)
    return answers


def _refuse_closed(keys: set[tuple[int, int]], held: dict) -> None:
    """409 log_closed if any of these held attempts ended more than the grace ago: its
    invocation ended then (finished_at), or it failed and waits for its retry, which
    was due then (scheduled_at: the attempt ended before it)."""
    cutoff = timezone.now() - timedelta(seconds=settings.LAKESHORE_LOG_APPEND_GRACE_SECONDS)
    closed = []
    for key in sorted(keys):
        row = held[key]
        if row["state"] == InvocationState.RUNNING:
            continue
        ended = row["finished_at"] if row["state"] in TERMINAL_STATES else row["scheduled_at"]
        if ended is None or ended < cutoff:
            closed.append({"invocation": key[0], "attempt": key[1]})
    if closed:
        grace = settings.LAKESHORE_LOG_APPEND_GRACE_SECONDS
        named = ", ".join(f"{c['invocation']} attempt {c['attempt']}" for c in closed)
        raise Conflict(
            f"The log of invocation {named} is closed: an attempt's lines are taken until "
            f"{grace:g} s after it ended (LAKESHORE_LOG_APPEND_GRACE_SECONDS). Nothing of "
            "this shipment was stored: send the other chunks again without these.",
            extra={"closed": closed},
            code="log_closed",
        )


_LOG_FIELDS = [
    "lines",
    "bytes",
    "head_bytes",
    "tail_bytes",
    "head_lines",
    "head_rows",
    "tail_rows",
    "last_row",
    "cut_lines",
    "cut_bytes",
    "dropped_lines",
    "next_seq",
    "updated_at",
]


def _key(chunk: dict) -> tuple[int, int]:
    return chunk["invocation"], chunk["attempt"]


def _locked_logs(keys: list[tuple[int, int]]) -> dict[tuple[int, int], JobLog]:
    """The attempts' JobLog rows, made if new, locked (in key order: two shipments never
    wait on each other in a circle)."""
    if not keys:
        return {}
    JobLog.objects.bulk_create(
        [JobLog(invocation_id=pk, attempt=attempt) for pk, attempt in keys],
        ignore_conflicts=True,
    )
    rows = (
        JobLog.objects.select_for_update()
        .filter(invocation_id__in={pk for pk, _ in keys})
        .order_by("invocation_id", "attempt")
    )
    wanted = set(keys)  # the rows of the invocations' other attempts are not these
    return {
        (row.invocation_id, row.attempt): row
        for row in rows
        if (row.invocation_id, row.attempt) in wanted
    }


def _append(log: JobLog, chunk: dict, kept: KeptRows) -> None:
    """Count the chunk into its log and cut it into what the head keeps and what the
    tail keeps (its front cut if it alone is past the tail's half), into `kept`. The
    head is full at its half of the bytes, or of the rows (LAKESHORE_LOG_MAX_ROWS)."""
    lines = chunk["lines"]
    sizes = [len(text.encode()) + 1 for _, _, text in lines]
    first = log.lines
    log.next_seq = chunk["seq"] + 1
    log.lines += len(lines)
    log.bytes += sum(sizes)
    log.dropped_lines += chunk["dropped"]
    half = settings.LAKESHORE_LOG_MAX_BYTES // 2
    head = 0
    if log.head_lines is None:
        room = half - log.head_bytes
        while head < len(lines) and sizes[head] <= room:
            room -= sizes[head]
            head += 1
        rows_left = log.head_rows < settings.LAKESHORE_LOG_MAX_ROWS // 2
        if head and not rows_left:
            in_place = sum(sizes[:head]), head, chunk["dropped"]
            if not kept.joins(log, first, *in_place, in_head=True):
                head = 0  # no row left in the head for these: they go to the tail
        log.head_bytes += sum(sizes[:head])
        if head < len(lines):
            log.head_lines = first + head  # the head is full: the rest is the tail
    dropped = chunk["dropped"]
    if head:
        kept.add(log, first, lines[:head], sizes[:head], dropped, in_head=True)
        dropped = 0
    tail, rest = head, sum(sizes[head:])
    while tail < len(lines) and rest > half:  # more than the tail keeps: its front goes
        log.cut_lines += 1
        log.cut_bytes += sizes[tail]
        rest -= sizes[tail]
        tail += 1
    if tail < len(lines):
        kept.add(log, first + tail, lines[tail:], sizes[tail:], dropped, in_head=False)
        log.tail_bytes += rest


# ---------------------------------------------------------------------------- reading


def read(invocation_id, **query) -> dict:
    """Lines of one attempt (the latest by default) from line `offset` on (or the last
    `tail`), of one stream and from a time if asked. With follow, a read that finds no
    new line sleeps until one comes, the attempt ends, or `wait` seconds pass. A caller
    that has the invocation's row already passes it (`invocation`). read_steps' keywords;
    its waits sleep in this thread, with a slot of jobs/waits.py."""
    return waits.drive(read_steps(invocation_id, **query))


def read_steps(
    invocation_id,
    *,
    attempt: int | None = None,
    offset: int = 0,
    limit: int = READ_DEFAULT_LINES,
    tail: int | None = None,
    stream: str | None = None,
    since: datetime | None = None,
    follow: bool = False,
    wait: float = FOLLOW_MAX_SECONDS,
    invocation: Invocation | None = None,
) -> waits.Steps:
    """read as steps (jobs/waits.py): a follow that finds no new line yields a Wait
    between looks: woken by the next line shipped (`log:ID`, notified:
    jobs/migrations/0013), looking again after a growing pause (50 ms to 500 ms) for the
    attempt's end, which is not notified; it stops waiting when a wait is refused or
    the server is stopping."""
    invocation = invocation or services.invocation_get(invocation_id, fields=_READ_FIELDS)
    attempt = _attempt(invocation, attempt)
    listening = [f"log:{invocation.pk}"]
    seen = wakeup.listener.snapshot(listening) if follow else ()  # before the look
    log = JobLog.objects.filter(invocation_id=invocation.pk, attempt=attempt).first()
    if tail is not None:
        offset = max(0, (log.lines if log else 0) - tail)
    answer = _page(invocation, attempt, log, offset, limit, stream, since)
    if follow and not answer["lines"] and not answer["finished"]:
        deadline = time.monotonic() + min(wait, FOLLOW_MAX_SECONDS)
        yield from _until_more(invocation.pk, attempt, answer["next_offset"], deadline, seen)
        invocation.refresh_from_db(fields=["state", "attempts"])
        log = JobLog.objects.filter(invocation_id=invocation.pk, attempt=attempt).first()
        answer = _page(invocation, attempt, log, answer["next_offset"], limit, stream, since)
    return answer


def _attempt(invocation: Invocation, attempt: int | None) -> int:
    """The attempt asked for, the latest by default. The next one may be asked for
    while the invocation has not ended (a follower waits for it to start)."""
    if attempt is None:
        return max(invocation.attempts, 1)
    last = invocation.attempts if invocation.is_finished else invocation.attempts + 1
    if not 1 <= attempt <= max(last, 1):
        raise NotFound(
            f"Invocation {invocation.pk} has no attempt {attempt} "
            f"(it has had {invocation.attempts}).",
            fields={"attempt": "not_found"},
        )
    return attempt


def attempt_over(invocation: Invocation, attempt: int) -> bool:
    """No more lines will come for this attempt: it ended, or a later one started (or,
    not started yet, the invocation ended without it: killed while queued)."""
    if attempt > invocation.attempts:
        return invocation.is_finished
    return not (invocation.state == InvocationState.RUNNING and attempt == invocation.attempts)


def _until_more(pk: int, attempt: int, offset: int, deadline: float, seen) -> waits.Steps:
    """Until the log has a line past `offset` or the attempt is over; no database
    connection held while waiting. `seen`: the log's channel before the last look."""
    pause = 0.05
    listening = [f"log:{pk}"]
    while (left := deadline - time.monotonic()) > 0:
        if not connection.in_atomic_block:
            connection.close()
        woken = yield waits.Wait(listening, seen, min(pause, left))
        if woken is None or wakeup.listener.closing:
            return
        pause = min(pause * 1.5, 0.5)
        seen = wakeup.listener.snapshot(listening)
        lines = (
            JobLog.objects.filter(invocation_id=pk, attempt=attempt)
            .values_list("lines", flat=True)
            .first()
        )
        if lines is not None and lines > offset:
            return
        row = Invocation.objects.filter(pk=pk).values("state", "attempts").first()
        if row is None or attempt_over(Invocation(**row), attempt):
            return


def _page(invocation, attempt, log, offset, limit, stream, since) -> dict:
    lines, next_offset = [], offset
    if log is not None and offset < log.lines:
        lines, next_offset = _lines(log, offset, limit, stream, since)
    finished = attempt_over(invocation, attempt)
    total = log.lines if log else 0
    return {
        "invocation": str(invocation.pk),
        "attempt": attempt,
        "attempts": invocation.attempts,
        "state": invocation.state,
        "offset": offset,
        "next_offset": max(next_offset, offset),
        "lines": lines,
        "total_lines": total,
        "cut": {"lines": log.cut_lines, "bytes": log.cut_bytes} if log and log.cut_lines else None,
        "dropped_lines": log.dropped_lines if log else 0,
        "finished": finished,
        "complete": finished and next_offset >= total,
    }


def _lines(log, offset, limit, stream, since) -> tuple[list[dict], int]:
    """Up to `limit` lines from `offset`, with the markers on the way; and the line
    number to go on from."""
    letter = STREAM_LETTERS.get(stream) if stream else None
    after = since.timestamp() if since else None
    chunks = (
        LogChunk.objects.filter(
            invocation_id=log.invocation_id,
            attempt=log.attempt,
            first_line__gt=offset - CHUNK_MAX_LINES,
        )
        .annotate(end=F("first_line") + F("count"))
        .filter(end__gt=offset)
        .order_by("first_line")
    )
    found, size, position = [], 0, offset
    for chunk in chunks.iterator(chunk_size=20):
        if chunk.first_line > position and not chunk.in_head:  # the lines cut before it
            found.append(_marker(position, CUT, _cut_text(log)))
        if chunk.dropped and chunk.first_line >= offset:
            found.append(_marker(chunk.first_line, DROPPED, _dropped_text(chunk.dropped)))
        position = max(position, chunk.first_line)
        texts = chunk.text.split("\n")
        for i in range(max(0, offset - chunk.first_line), chunk.count):
            number = chunk.first_line + i
            position = number + 1
            if letter and chunk.streams[i] != letter:
                continue
            if after is not None and chunk.times[i] < after:
                continue
            found.append(
                {
                    "n": number,
                    "at": _iso(chunk.times[i]),
                    "stream": STREAMS[chunk.streams[i]],
                    "text": texts[i],
                }
            )
            size += len(texts[i]) + 1
            if len(found) >= limit or size >= READ_MAX_BYTES:
                return found, position
    return found, max(position, log.lines)


def _marker(number: int, kind: str, text: str) -> dict:
    return {"n": number, "at": None, "stream": kind, "text": text}


def _cut_text(log: JobLog) -> str:
    bound = settings.LAKESHORE_LOG_MAX_BYTES
    rows = settings.LAKESHORE_LOG_MAX_ROWS
    return (
        f"[lakeshore] {log.cut_lines:,} lines ({_size(log.cut_bytes)}) cut here: an attempt's "
        f"log keeps its first and last {_size(bound // 2)} (LAKESHORE_LOG_MAX_BYTES), "
        f"in {rows // 2:,} rows each (LAKESHORE_LOG_MAX_ROWS)"
    )


def _dropped_text(count: int) -> str:
    return (
        f"[lakeshore] {count:,} lines lost here: the daemon's buffer was full (the server "
        "was away, or took lines slower than the job printed them)"
    )


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def text_lines(invocation_id, attempt: int | None = None):
    """The whole kept log of an attempt as plain text lines (a download), with the
    markers; read a page at a time."""
    offset = 0
    while True:
        page = read(invocation_id, attempt=attempt, offset=offset, limit=READ_MAX_LINES)
        for line in page["lines"]:
            yield line["text"] + "\n"
        if page["next_offset"] <= offset or page["next_offset"] >= page["total_lines"]:
            return
        offset = page["next_offset"]
