"""Shipping what jobs print: the `Shipper` (a thread of its own) sends the log book's
lines (lakeshore.joblog) to the server at least every SHIP_EVERY seconds while lines
wait, each registration's to its own POST …/daemons/<id>/logs/. An outcome whose job
left lines waiting or on their way is reported only after they landed (`then_report`),
so a reader who sees the job end has every line it printed, up to a kill.

A server that cannot be reached is retried with back-off (the book keeps lines up to
its bound meanwhile, and counts what it drops); a chunk the server calls stale (the
attempt is no longer this daemon's) is dropped; a shipment refused for an attempt that
ended a while ago (log_closed) is sent again without that attempt's lines, which go to
this daemon's own log. A server without the logs route (404:
older than the daemon; the daemon itself exists, it claimed the job) gets none: the
lines then go to this daemon's own log, as before per-job logs."""

import threading
import time
from collections.abc import Callable

from lakeshore.client import path
from lakeshore.errors import ApiError
from lakeshore.joblog import LogBook, to_daemon_log
from lakeshore.pool.job_process import Running
from lakeshore.worker.calls import Stopped
from lakeshore.worker.reporting import Outcome

SHIP_EVERY = 0.5  # seconds: lines wait at most about this long while a job runs
LOG_CLOSED = "log_closed"  # lines for an attempt that ended a while ago: refused whole


def attempt_key(item: Running) -> tuple[int, int]:
    return int(item.id), int(item.invocation.get("attempts") or 1)


class Shipper:
    """Ships the `book`'s lines from a thread of its own (`start`, `close`), and holds an
    outcome back until its job's lines are out (`then_report`, then `ready`)."""

    def __init__(
        self,
        book: LogBook,
        call: Callable[..., object],
        *,
        ready: Callable[[list[Outcome]], None],
        log: Callable[[str], None],
        every: float = SHIP_EVERY,
    ):
        self.book = book
        self.call = call  # the Session's call: retries while the server is unreachable
        self.ready = ready  # outcomes whose lines are shipped: the reporter may send them
        self.log = log
        self.every = every
        self.cond = threading.Condition(threading.Lock())
        self.waiting: list[Outcome] = []  # outcomes waiting for their lines to be shipped
        self.closing = False
        self.enabled = True  # False: the server has no logs route (404)
        self.shipped = 0  # requests sent, for figures and tests
        self.thread = threading.Thread(target=self._loop, name="logs", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def forget(self, item: Running) -> None:
        """An abandoned invocation's lines are not shipped (the server ended it)."""
        self.book.forget(attempt_key(item))

    def then_report(self, outcome: Outcome) -> bool:
        """True: the outcome's job left lines waiting, and it is reported once they are
        shipped (the reporter holds it until then). False: nothing waits for it."""
        key = attempt_key(outcome.item)
        if not self.book.pending({key}):
            self.book.forget(key)
            return False
        outcome.ready = False  # before the reporter has it: it waits for the lines
        with self.cond:
            self.waiting.append(outcome)
            self.cond.notify()
        return True

    def close(self, timeout: float) -> None:
        """Ships what waits (once), then ends the thread."""
        with self.cond:
            self.closing = True
            self.cond.notify()
        if self.thread.is_alive():
            self.thread.join(timeout)
        self._release(list(self.waiting))

    def _loop(self) -> None:
        last = 0.0
        while True:
            with self.cond:
                while not (self.waiting or self.closing):
                    due = last + self.every - time.monotonic()
                    if self.book.has_lines.is_set() and due <= 0:
                        break
                    self.cond.wait(max(due, 0.05) if self.book.has_lines.is_set() else 0.5)
                closing = self.closing
                urgent = list(self.waiting)
            last = time.monotonic()
            try:
                shipped = self._ship_once()
            except Stopped:
                self._release(urgent)
                return
            # one shipment at a time: an outcome goes as soon as its own lines are out,
            # even while other jobs keep printing
            done = [o for o in urgent if not self.book.pending({attempt_key(o.item)})]
            self._release(done)
            if closing and not shipped:
                return

    def _ship_once(self) -> bool:
        """One shipment (at most SHIPMENT_MAX_BYTES): False when nothing waited."""
        chunks = self.book.take()
        by_daemon: dict[str | None, list[dict]] = {}
        for chunk in chunks:
            by_daemon.setdefault(chunk.pop("daemon_id"), []).append(chunk)
        try:
            for daemon_id, group in by_daemon.items():
                self._ship(daemon_id, group)
        finally:
            self.book.landed(chunks)
        return bool(chunks)

    def _ship(self, daemon_id: str | None, chunks: list[dict], *, resent: bool = False) -> None:
        if not self.enabled or daemon_id is None:
            self._to_own_log(chunks)
            return
        self.shipped += 1
        for chunk in chunks:
            if chunk["dropped"]:
                self.log(
                    f"invocation {chunk['invocation']}: {chunk['dropped']} log line(s) dropped "
                    "(the buffer was full: the server away, or slower than the job's output)"
                )
        try:
            self.call("POST", path("daemons", daemon_id, "logs"), {"chunks": chunks})
        except ApiError as exc:
            if exc.code == LOG_CLOSED and not resent:
                self._without_closed(daemon_id, chunks, exc)
                return
            if exc.status == 404:  # the daemon exists (it claimed): the route does not
                self.enabled = False
                self.log("the server takes no job logs (404): job output goes to this log")
                self._to_own_log(chunks)
                return
            lines = sum(len(chunk["lines"]) for chunk in chunks)
            self.log(f"{lines} log line(s) not shipped ({exc.status} {exc.code}: {exc.message})")

    def _without_closed(self, daemon_id: str, chunks: list[dict], exc: ApiError) -> None:
        """The server refused the shipment whole for the attempts it names (their logs
        closed a while after they ended): their lines go to this daemon's own log, the
        rest is sent again, once."""
        closed = {
            (item.get("invocation"), item.get("attempt")) for item in exc.detail.get("closed", [])
        }
        late = [c for c in chunks if (c["invocation"], c["attempt"]) in closed]
        rest = [c for c in chunks if (c["invocation"], c["attempt"]) not in closed]
        lines = sum(len(chunk["lines"]) for chunk in late)
        self.log(f"{lines} log line(s) of ended attempts refused ({exc.code}): kept here")
        self._to_own_log(late)
        if rest:
            self._ship(daemon_id, rest, resent=True)

    def _to_own_log(self, chunks: list[dict]) -> None:
        for chunk in chunks:
            whose = f"invocation {chunk['invocation']}"
            for stream, _, text in chunk["lines"]:
                to_daemon_log(self.log, whose, stream, [text])

    def _release(self, outcomes: list[Outcome]) -> None:
        if not outcomes:
            return
        with self.cond:
            self.waiting = [o for o in self.waiting if not any(o is d for d in outcomes)]
        for outcome in outcomes:
            self.book.forget(attempt_key(outcome.item))
        self.ready(outcomes)
