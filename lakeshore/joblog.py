"""What a job prints, on the daemon: its stdout and stderr cut into lines as they are
read (Lines), and the lines of every attempt this daemon runs, waiting to be shipped
to the server (LogBook; lakeshore.worker.logs ships them).

A line ends at a newline or a carriage return (a progress bar's update is a line of
its own); a line longer than LINE_MAX_BYTES is cut into pieces; bytes that are not
UTF-8 become U+FFFD, and a NUL (which PostgreSQL does not store) the text \\x00. The
server's limits (jobs/logs.py) are the same.

The book is bounded: at most BOOK_MAX_BYTES waiting in all (the server unreachable, or
a job printing faster than it takes them). Past it, the oldest waiting lines of the
attempt that prints are dropped, counted, and the count goes with its next chunk: the
reader sees a marker saying how many lines were lost there. An attempt's first
HEAD_KEEP_BYTES are never dropped (the start of a run, its settings and first errors,
is what a reader looks for first, and the server keeps a log's head too)."""

import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

LINE_MAX_BYTES = 16 * 1024
CHUNK_MAX_LINES = 10_000
CHUNK_MAX_BYTES = 1024 * 1024
BOOK_MAX_BYTES = 16 * 1024 * 1024
HEAD_KEEP_BYTES = 1024 * 1024
SHIPMENT_MAX_BYTES = 4 * 1024 * 1024  # under the server's request limit (10 MiB) as JSON
SHIPMENT_MAX_CHUNKS = 100
# 4 JSON values a line: a shipment stays under the server's LAKESHORE_JSON_MAX_VALUES
SHIPMENT_MAX_LINES = 100_000
OUT, ERR = "o", "e"


class Lines:
    """One stream of one process: bytes in, whole lines out."""

    def __init__(self, stream: str):
        self.stream = stream
        self.partial = bytearray()
        self.after_cr = False  # the last read ended a line with \r: a \n next is its end

    def feed(self, data: bytes) -> list[str]:
        if self.after_cr and data.startswith(b"\n"):
            data = data[1:]
        self.after_cr = data.endswith(b"\r")
        self.partial += data
        lines = []
        start = 0
        buffer = self.partial
        while True:
            newline = buffer.find(b"\n", start)
            ret = buffer.find(b"\r", start)
            if newline < 0 and ret < 0:
                break
            end = newline if ret < 0 or (0 <= newline < ret) else ret
            lines.extend(_pieces(bytes(buffer[start:end])))
            start = end + 1
            if buffer[end : end + 1] == b"\r" and buffer[start : start + 1] == b"\n":
                start += 1  # \r\n: one line end
        del buffer[:start]
        while len(buffer) > LINE_MAX_BYTES:  # a line with no end in sight: its pieces
            lines.extend(_pieces(bytes(buffer[:LINE_MAX_BYTES])))
            del buffer[:LINE_MAX_BYTES]
        return lines

    def end(self) -> list[str]:
        """What is left without a line end (the stream closed, or the job ended)."""
        if not self.partial:
            return []
        rest = bytes(self.partial)
        self.partial.clear()
        return _pieces(rest)


def _pieces(raw: bytes) -> list[str]:
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    pieces = [raw[i : i + LINE_MAX_BYTES] for i in range(0, max(len(raw), 1), LINE_MAX_BYTES)]
    return [_text(piece) for piece in pieces]


def _text(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").replace("\x00", "\\x00")
    while len(text.encode()) > LINE_MAX_BYTES:  # replacements grew it past the bound
        text = text[: len(text) - 64]
    return text


def to_daemon_log(log: Callable[[str], None], whose: str, stream: str, lines: list[str]) -> None:
    """Lines with no job log to go to (printed between invocations, by one no longer
    this daemon's, or for a server without job logs): the daemon's own log, a line each."""
    for line in lines:
        log(f"{whose} {stream}| {line}")


@dataclass
class Attempt:
    """The lines of one attempt waiting to be shipped."""

    invocation: int
    attempt: int
    daemon_id: str | None
    head_left: int = HEAD_KEEP_BYTES  # bytes still to come that are never dropped
    head: deque = field(default_factory=deque)  # [stream, time, text]: never dropped
    waiting: deque = field(default_factory=deque)  # [stream, time, text]
    bytes: int = 0
    seq: int = 0  # the next chunk's number
    dropped: int = 0  # lines dropped since the last chunk taken
    lines: int = 0  # every line read, for figures and tests
    in_flight: int = 0  # chunks taken and not landed yet (see LogBook.landed)


class LogBook:
    """Every attempt's waiting lines (any thread may add; the shipper takes)."""

    def __init__(self, max_bytes: int = BOOK_MAX_BYTES, head_keep: int = HEAD_KEEP_BYTES):
        self.max_bytes = max_bytes
        self.head_keep = head_keep
        self.lock = threading.Lock()
        self.attempts: dict[tuple[int, int], Attempt] = {}
        self.bytes = 0
        self.dropped = 0  # in all, since the daemon started
        self.has_lines = threading.Event()

    def add(
        self, key: tuple[int, int], daemon_id: str | None, stream: str, lines: list[str]
    ) -> None:
        if not lines:
            return
        now = time.time()
        with self.lock:
            attempt = self.attempts.get(key)
            if attempt is None:
                attempt = self.attempts[key] = Attempt(
                    key[0], key[1], daemon_id, head_left=self.head_keep
                )
            for text in lines:
                size = len(text) + 1
                if attempt.head_left > 0:
                    attempt.head.append([stream, now, text])
                    attempt.head_left -= size
                else:
                    attempt.waiting.append([stream, now, text])
                attempt.bytes += size
                attempt.lines += 1
                self.bytes += size
            while self.bytes > self.max_bytes and attempt.waiting:
                _, _, text = attempt.waiting.popleft()
                attempt.bytes -= len(text) + 1
                self.bytes -= len(text) + 1
                attempt.dropped += 1
                self.dropped += 1
        self.has_lines.set()

    def pending(self, keys: Collection[tuple[int, int]] | None = None) -> bool:
        """Lines of these attempts (every one by default) not landed yet: waiting, or
        taken and on their way. An outcome reported while its last lines are on their
        way could reach the server first, and a reader who saw the job end would miss
        them."""
        with self.lock:
            return any(  # a count of dropped lines alone waits for a line to carry it
                a.head or a.waiting or a.in_flight
                for k, a in self.attempts.items()
                if keys is None or k in keys
            )

    def in_flight(self) -> int:
        """Chunks taken and not landed yet."""
        with self.lock:
            return sum(a.in_flight for a in self.attempts.values())

    def take(self, keys: Collection[tuple[int, int]] | None = None) -> list[dict]:
        """Chunks to ship (at most SHIPMENT_MAX_BYTES and SHIPMENT_MAX_LINES), each with
        its attempt's next seq. `keys`: only these attempts. What is taken is no longer
        waiting but still pending until the shipper says it `landed`."""
        chunks: list[dict] = []
        size = shipped = 0
        with self.lock:
            for key, attempt in self.attempts.items():
                if keys is not None and key not in keys:
                    continue
                while (
                    (attempt.head or attempt.waiting)
                    and size < SHIPMENT_MAX_BYTES
                    and shipped < SHIPMENT_MAX_LINES
                ):
                    if len(chunks) >= SHIPMENT_MAX_CHUNKS:
                        break
                    # the head first, in chunks of its own: a drop count goes with the
                    # first chunk of the lines after it, where the lines were lost
                    source = attempt.head or attempt.waiting
                    lines: list = []
                    taken = 0
                    while (
                        source
                        and len(lines) < CHUNK_MAX_LINES
                        and taken < CHUNK_MAX_BYTES
                        and size + taken < SHIPMENT_MAX_BYTES
                        and shipped + len(lines) < SHIPMENT_MAX_LINES
                    ):
                        line = source.popleft()
                        lines.append(line)
                        taken += len(line[2]) + 1
                    if not lines:  # no room left in this shipment
                        break
                    attempt.bytes -= taken
                    self.bytes -= taken
                    from_head = source is attempt.head
                    chunks.append(
                        {
                            "daemon_id": attempt.daemon_id,
                            "invocation": attempt.invocation,
                            "attempt": attempt.attempt,
                            "seq": attempt.seq,
                            "dropped": 0 if from_head else attempt.dropped,
                            "lines": lines,
                        }
                    )
                    attempt.seq += 1
                    attempt.in_flight += 1
                    if not from_head:
                        attempt.dropped = 0
                    size += taken
                    shipped += len(lines)
            if not any(a.head or a.waiting for a in self.attempts.values()):
                self.has_lines.clear()
        return chunks

    def landed(self, chunks: list[dict]) -> None:
        """The chunks `take` gave are done with: the server has them, or refused them,
        or they went to the daemon's own log. An attempt forgotten meanwhile (its
        invocation abandoned) and begun again by a late line counts none of them."""
        with self.lock:
            for chunk in chunks:
                attempt = self.attempts.get((chunk["invocation"], chunk["attempt"]))
                if attempt is not None and attempt.in_flight > 0:
                    attempt.in_flight -= 1

    def forget(self, key: tuple[int, int]) -> None:
        """The attempt's log is shipped (or can never be): drop what is left of it."""
        with self.lock:
            attempt = self.attempts.pop(key, None)
            if attempt is not None:
                self.bytes -= attempt.bytes
