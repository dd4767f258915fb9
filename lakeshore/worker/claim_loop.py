"""The claim loop: a thread of its own that claims invocations of the daemon's queues
for the room the slots have (long-polling when it has nothing to report), takes the
outcomes waiting along in one exchange, and hands what it claims to the slots, whose
spawner starts it. While jobs are short it claims ahead of the free slots (see the
package's docstring, "Claiming ahead")."""

import random
import threading
import time
from collections.abc import Callable

import httpx

from lakeshore.client import long_poll, path, retry_after
from lakeshore.errors import ApiError
from lakeshore.worker.calls import TOKEN_REVOKED, Session, Stopped
from lakeshore.worker.reporting import Completer, Outcome, Reporter, read_answers
from lakeshore.worker.slots import Slots
from lakeshore.worker.stopping import Stopping

STATE_HEADER = "Lakeshore-Daemon-State"  # on a claim's answer: "draining" when asked to

# What this daemon runs: JSON invocations, and the Python SDK's @dls.udf calls
# (lakeshore.sdk_job), not the SDK's bare values, which only SyncQueue.claim handles.
WIRES = ["json", "envelope"]

NotLive = Callable[[ApiError, str | None], None]
"""not_live(error, daemon_id): the server refused `daemon_id` as no longer live (409, or
its credential revoked); the Worker leaves, or registers again."""


class ClaimLoop:
    """Claims work for the slots, from a thread of its own (`start`, `join`).

    Its state is its own: `exchange` (False once the server answered 404 to one: it
    has none), the Retry-After it waits out, and when a claim was last answered or is
    in flight, which the heartbeat reads (`answered_at`, `waiting`) to skip beats the
    claims make needless."""

    def __init__(
        self,
        session: Session,
        slots: Slots,
        reporter: Reporter,
        completer: Completer,
        stopping: Stopping,
        *,
        wait: float,
        not_live: NotLive,
        drain_asked: Callable[[], None],
        log: Callable[[str], None],
        debug: Callable[[str], None],
    ):
        self.session = session
        self.slots = slots
        self.reporter = reporter
        self.completer = completer
        self.stopping = stopping
        self.wait = wait  # seconds an idle claim long-polls
        self.not_live = not_live
        self.drain_asked = drain_asked
        self.log = log
        self.debug = debug
        self.exchange = True  # the server has …/exchange/ (False after a 404: apart)
        self.claim_after = 0.0  # a claim's Retry-After: the loop waits this first
        self.claim_answered = float("-inf")  # when a claim was last answered (monotonic)
        self.claim_in_flight = False  # a claim is out: the server holds it, so we are alive
        self.error: BaseException | None = None  # what ended the loop, raised by join
        self.thread = threading.Thread(target=self._lane, name="claim", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self) -> None:
        """Waits for the loop to end; raises what ended it, if not a stop."""
        self.thread.join()
        if self.error is not None:
            raise self.error

    def answered_at(self) -> float:
        """When a claim was last answered (monotonic; -inf: never)."""
        return self.claim_answered

    def waiting(self) -> bool:
        """Whether a claim is out now (the server holds it, so it knows we are alive)."""
        return self.claim_in_flight

    def _lane(self) -> None:
        try:
            self._claim_loop()
        except Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - raised on the spawner (join)
            self.error = exc
            self.stopping.hard.set()
        finally:
            self.slots.wake()

    def _claim_loop(self) -> None:
        try:
            while not self.stopping.any():
                # A job that ends frees a slot, and the request this loop then sends
                # carries its outcome: the reporter leaves it to us.
                self.reporter.carry(self.session.daemon_id if self.exchange else None)
                free, busy = self.slots.reserve()
                if free <= 0:
                    continue
                failed_id = self.session.daemon_id
                asked = time.monotonic()
                try:
                    claimed = self.claim(failed_id, free, busy)
                except Stopped:
                    self.slots.claimed(free, [], failed_id)
                    return
                except ApiError as exc:
                    self.slots.claimed(free, [], failed_id)
                    if exc.status != 409 and exc.code != TOKEN_REVOKED:
                        raise
                    self.reporter.carry(None)  # registering again, or stopping
                    self.not_live(exc, failed_id)
                    continue
                except BaseException:
                    self.slots.claimed(free, [], failed_id)
                    raise
                self.slots.claimed(free, claimed, failed_id)
                if claimed:
                    took = (time.monotonic() - asked) * 1000
                    self.debug(f"claimed {len(claimed)} (limit {free}) in {took:.0f} ms")
                self._claim_later()
        finally:
            self.reporter.carry(None)  # what ends from now on is the reporter's to send

    def claim(self, daemon_id: str | None, limit: int, busy: bool) -> list[dict]:
        """Claims up to `limit`. Outcomes waiting go with it in one exchange, which does
        not long-poll (their answers come at once; if it finds no work, the next claim
        waits for some): outcomes that end meanwhile wait for the next one. Without
        outcomes, a claim that long-polls: 2 s while jobs run, `wait` when idle;
        outcomes that end meanwhile go on their own, after the linger."""
        batch = self.reporter.take(daemon_id) if self.exchange else []
        if batch:
            claimed = self._exchange(daemon_id, batch, limit)
            if claimed is not None:
                return claimed
        self.reporter.carry(None)
        url = path("daemons", daemon_id, "claim")
        wait = 2.0 if busy else self.wait
        body = {"limit": limit, "wait": wait, "wires": WIRES}
        self.claim_in_flight = True
        try:
            response = self.session.send(
                "POST", url, body, give_up=self.stopping.draining, timeout=long_poll(wait)
            )
            answer = self._claimed(response)
            return answer if isinstance(answer, list) else []
        finally:
            self.claim_in_flight = False

    def _claimed(self, response: httpx.Response) -> object:
        """A claim's or an exchange's answer; its Retry-After (the server had no room
        for our long-poll) is kept for the claim loop."""
        self.claim_after = retry_after(response) or 0.0
        self.claim_answered = time.monotonic()  # the server saw us: heartbeat.py
        if response.headers.get(STATE_HEADER) == "draining":
            self.drain_asked()
        return self.session.decode(response)

    def _claim_later(self) -> None:
        """After a claim answered with Retry-After: wait that long plus up to as long
        again at random (so daemons refused together do not come back together),
        while outcomes leave on their own. Ends early when the daemon stops."""
        if self.claim_after <= 0:
            return
        pause = self.claim_after * (1 + random.random())  # noqa: S311 - jitter
        self.claim_after = 0.0
        self.debug(f"the server is full of long-polls (Retry-After): claiming in {pause:.1f} s")
        self.reporter.carry(None)
        until = time.monotonic() + pause
        while not self.stopping.any() and (left := until - time.monotonic()) > 0:
            self.stopping.draining.wait(min(left, 0.5))

    def _exchange(self, daemon_id: str | None, batch: list[Outcome], limit: int) -> list | None:
        """Reports `batch` and claims up to `limit` in one request: the invocations
        claimed, or None when the server would not take the exchange (400, or 404: a
        server without it, asked no more), the outcomes then given back to the reporter.
        Retried whole like any request (a repeat of recorded outcomes answers them as
        recorded). A 409 (daemon_terminated, daemon_lost) is raised for the claim loop,
        the outcomes given back: complete then says which were recorded."""
        url = path("daemons", daemon_id, "exchange")
        body = {
            "outcomes": [outcome.body() for outcome in batch],
            "limit": limit,
            "wait": 0,
            "wires": WIRES,
        }
        started = time.monotonic()
        try:
            response = self.session.send("POST", url, body, give_up=self.stopping.draining)
            answer = self._claimed(response)
        except Stopped:
            self.reporter.give_back(batch)
            raise
        except ApiError as exc:
            self.reporter.give_back(batch)
            if exc.status == 404:
                self.exchange = False
                self.log(
                    f"the server has no exchange ({exc.message}): reporting and claiming apart"
                )
                return None
            if exc.status == 400:
                return None
            raise
        answer = answer if isinstance(answer, dict) else {}
        took = (time.monotonic() - started) * 1000
        self.debug(f"reported {len(batch)} outcome(s) in 1 request(s), an exchange ({took:.0f} ms)")
        self.completer.record(batch, read_answers(batch, answer.get("recorded")))
        self.reporter.finished(batch)
        claimed = answer.get("claimed")
        return claimed if isinstance(claimed, list) else []
