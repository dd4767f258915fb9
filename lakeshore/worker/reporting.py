"""Reporting outcomes: an `Outcome` (an invocation's end, as complete takes it), the
`Reporter` (a thread of its own that sends them in batches, at REPORT_BATCH of them or
REPORT_LINGER seconds after the first, unless the claim loop takes them along in an
exchange), and the `Completer`: the complete requests and what their answers say of
each outcome. An outcome whose job's last lines are still being shipped
(lakeshore.worker.logs) waits, in its place in the queue, until they are."""

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from lakeshore.client import path
from lakeshore.errors import ApiError
from lakeshore.pool.job_process import Running
from lakeshore.sdk_job import FinalError, ResultBlob
from lakeshore.worker.calls import CLAIM_STALE, KILLED, Session, Stopped

REPORT_BATCH = 50  # outcomes per complete request, at most (the server takes 1,000)
REPORT_LINGER = 0.005  # seconds a batch waits for company after its first outcome

Answer = dict[str, object]
"""What the server said of one outcome: {"ok": True}, or {"ok": False, "why": str}."""


@dataclass
class Outcome:
    item: Running
    state: str  # succeeded, failed, timeout
    result: object
    error: str
    took: float  # seconds from handing it out to its end
    at: float = 0.0  # when it ended (monotonic)
    ready: bool = True  # False while its job's last lines are being shipped (worker.logs)

    def body(self) -> dict:
        body = {
            "invocation": int(self.item.id),
            "attempt": self.item.invocation["attempts"],
            "state": self.state,
            "result": self.result,
            "error": self.error,
        }
        if isinstance(self.result, ResultBlob):  # the Python SDK's result bytes (base64)
            body["result"], body["result_blob"] = None, str(self.result)
        if isinstance(self.error, FinalError):  # another attempt cannot help
            body["retry"] = False
        return body


class Reporter:
    """Sends outcomes from a thread of its own, many to a request: a batch leaves when it
    holds `batch` outcomes or `linger` seconds after its first one came, whichever is
    first (at once, if the previous request took longer than that).

    The claim loop may `take` outcomes to send with its claim. While it says it will
    (`carry`: the registration whose outcomes its next request carries), outcomes of
    that registration past their linger wait for it; a full batch still leaves."""

    def __init__(
        self,
        send: Callable[[list[Outcome]], None],
        sent: Callable[[], None],
        *,
        batch: int = REPORT_BATCH,
        linger: float = REPORT_LINGER,
    ):
        self.send = send  # sends one batch; retries and logs are its business
        self.sent = sent  # called after each batch (the daemon's drain waits on it)
        self.batch = batch
        self.linger = linger
        self.cond = threading.Condition(threading.Lock())
        self.queue: deque[Outcome] = deque()
        self.busy: list[Outcome] = []  # taken from the queue (by either), not yet answered
        self.carrier: str | None = None  # the claim loop will take this registration's
        self.closing = False
        self.thread = threading.Thread(target=self._loop, name="reporter", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def put(self, outcome: Outcome) -> None:
        with self.cond:
            outcome.at = time.monotonic()
            self.queue.append(outcome)
            self.cond.notify()

    def mark_ready(self, outcomes: list[Outcome]) -> None:
        """Their jobs' lines are shipped: they may go (in their order in the queue)."""
        with self.cond:
            for outcome in outcomes:
                outcome.ready = True
            self.cond.notify()

    def pending(self) -> int:
        with self.cond:
            return len(self.queue) + len(self.busy)

    def pending_ids(self) -> list[str]:
        """The invocations whose outcome is not yet answered (queued or being sent)."""
        with self.cond:
            return [o.item.id for o in self.queue] + [o.item.id for o in self.busy]

    def carry(self, daemon_id: str | None) -> None:
        """The claim loop's next request carries this registration's outcomes (None: it
        carries nothing soon; the reporter sends them after the linger)."""
        with self.cond:
            if self.carrier != daemon_id:
                self.carrier = daemon_id
                self.cond.notify()

    def take(self, daemon_id: str | None) -> list[Outcome]:
        """For the claim loop: the outcomes of `daemon_id` at the head of the queue (up to
        a batch), at once. Hand them back with `finished` or `give_back`."""
        with self.cond:
            batch = self._pop(daemon_id)
            self.busy.extend(batch)
            return batch

    def finished(self, batch: list[Outcome]) -> None:
        """The server answered for `batch`."""
        with self.cond:
            self._unbusy(batch)
        self.sent()

    def give_back(self, batch: list[Outcome]) -> None:
        """Not recorded for sure (the request was refused or given up): the reporter sends
        them, before anything else."""
        with self.cond:
            self._unbusy(batch)
            self.queue.extendleft(reversed(batch))
            self.cond.notify()

    def close(self, timeout: float) -> None:
        """Sends what is queued (once: the daemon is stopping), then ends the thread."""
        with self.cond:
            self.closing = True
            self.cond.notify()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def _take(self) -> list[Outcome] | None:
        with self.cond:
            while True:  # the claim loop may take what we wait for: look again each time
                if not self.queue:
                    if self.closing:
                        return None
                    self.cond.wait()
                    continue
                if not self.queue[0].ready and not self.closing:  # its job's lines first
                    self.cond.wait(0.5)
                    continue
                if self.closing or len(self.queue) >= self.batch:
                    break
                first = self.queue[0]
                left = first.at + self.linger - time.monotonic()
                if left > 0:
                    self.cond.wait(left)
                elif first.item.daemon_id == self.carrier:
                    self.cond.wait()  # the claim loop's next request carries it
                else:
                    break
            batch = self._pop(self.queue[0].item.daemon_id)
            self.busy.extend(batch)
            return batch

    def _pop(self, daemon_id: str | None) -> list[Outcome]:
        """Up to a batch from the head, of one registration: after a re-registration the
        old claims' outcomes still go to the daemon id that claimed them."""
        batch: list[Outcome] = []
        while (
            self.queue
            and len(batch) < self.batch
            and self.queue[0].item.daemon_id == daemon_id
            and self.queue[0].ready
        ):
            batch.append(self.queue.popleft())
        return batch

    def _unbusy(self, batch: list[Outcome]) -> None:
        self.busy = [o for o in self.busy if not any(o is b for b in batch)]

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            try:
                self.send(batch)
            finally:
                self.finished(batch)


class Completer:
    """Sends batches of outcomes with complete requests (the reporter's `send`, on its
    thread) and records what the server said of each (also for the claim loop's
    exchanges): the log line, and the counts of what was recorded."""

    def __init__(
        self, session: Session, *, log: Callable[[str], None], debug: Callable[[str], None]
    ):
        self.session = session
        self.log = log
        self.debug = debug
        # recorded, by state; killed: what an operator stopped here (daemon exec), and
        # what ended here after a kill on the server came first (its outcome refused)
        self.counts = {"succeeded": 0, "failed": 0, "timeout": 0, "killed": 0}
        self.counts_lock = threading.Lock()  # the reporter and the claim loop count
        self.requests = 0  # complete requests sent (retries not counted)

    def summary(self) -> str:
        """What was recorded, for the daemon's last line: "3 succeeded, 0 failed, …"."""
        with self.counts_lock:
            return ", ".join(f"{n} {state}" for state, n in self.counts.items())

    def send(self, batch: list[Outcome]) -> None:
        """Sends one batch. Retried whole after a 5xx or an unreachable server: the
        server answers a repeat of the same complete with 200. Each outcome is fenced
        alone: a stale one does not refuse the others."""
        url = path("daemons", batch[0].item.daemon_id, "complete")
        started = time.monotonic()
        requests = self.requests
        try:
            if len(batch) == 1:
                answers = [self._send_one(url, batch[0])]
            else:
                answers = self._send_many(url, batch)
        except ApiError as exc:  # for the whole request: daemon_terminated, daemon_lost
            why = _refusal(exc.code, exc.message, exc.detail, exc.status)
            answers = [{"ok": False, "why": why}] * len(batch)
        except Stopped:
            for outcome in batch:
                self.log(f"invocation {outcome.item.id}: outcome not reported (stopping)")
            return
        took = (time.monotonic() - started) * 1000
        self.debug(
            f"reported {len(batch)} outcome(s) in {self.requests - requests} request(s) "
            f"({took:.0f} ms)"
        )
        self.record(batch, answers)

    def record(self, batch: list[Outcome], answers: list[Answer]) -> None:
        """What the server said of each outcome of `batch`: counted and logged."""
        for outcome, answer in zip(batch, answers, strict=True):
            if answer.get("ok"):
                with self.counts_lock:
                    self.counts[outcome.state] += 1
                self.log(f"invocation {outcome.item.id}: {outcome.state} in {outcome.took:.2f} s")
            else:
                if answer.get("killed"):
                    self.count_killed()
                self.log(
                    f"invocation {outcome.item.id}: outcome {outcome.state} not recorded "
                    f"({answer['why']})"
                )

    def count_killed(self) -> None:
        """One more invocation of this daemon's ended killed (for the summary)."""
        with self.counts_lock:
            self.counts["killed"] += 1

    def _send_one(self, url: str, outcome: Outcome) -> Answer:
        self.requests += 1
        try:
            self.session.call("POST", url, outcome.body())
        except ApiError as exc:
            if exc.status in (404, 409):  # the server's word on this one outcome
                why = _refusal(exc.code, exc.message, exc.detail, exc.status)
                return {"ok": False, "why": why, "killed": _killed(exc.code, exc.detail)}
            raise
        return {"ok": True}

    def _send_many(self, url: str, batch: list[Outcome]) -> list[Answer]:
        self.requests += 1
        try:
            answers = self.session.call("POST", url, [outcome.body() for outcome in batch])
        except ApiError as exc:
            if exc.status != 400:
                raise
            # A server without batched completes (or one refusing the batch as a whole):
            # one request per outcome, each with its own answer.
            return [self._send_one(url, outcome) for outcome in batch]
        return read_answers(batch, answers)


def read_answers(batch: list[Outcome], answers: object) -> list[Answer]:
    """The server's answers to a list of outcomes (complete's, exchange's `recorded`),
    one {"ok": bool, "why": str} per outcome."""
    if not isinstance(answers, list) or len(answers) != len(batch):
        why = f"the server's answer to {len(batch)} outcomes was not a list of as many"
        return [{"ok": False, "why": why}] * len(batch)
    out: list[Answer] = []
    for answer in answers:
        if isinstance(answer, dict) and answer.get("ok"):
            out.append({"ok": True})
            continue
        error = answer.get("error") if isinstance(answer, dict) else None
        error = error if isinstance(error, dict) else {}
        code = str(error.get("code") or "")
        why = _refusal(code, str(error.get("message") or "refused"), error)
        out.append({"ok": False, "why": why, "killed": _killed(code, error)})
    return out


def _killed(code: str, error: dict) -> bool:
    """Whether the server refused an outcome because the invocation was killed first."""
    return code == CLAIM_STALE and error.get("state") == KILLED


def _refusal(code: str, message: str, error: dict, status: int | None = None) -> str:
    """Why the server did not record an outcome, from its answer's code and `error` (the
    whole error object: a refused claim's `state` and `reason`)."""
    if _killed(code, error):
        reason = error.get("reason")
        return "killed on the server before this report came" + (f": {reason}" if reason else "")
    if code == CLAIM_STALE:
        return f"the claim was taken away: {message}"
    prefix = f"{status} " if status else ""
    return f"{prefix}{code or 'error'}: {message}"
