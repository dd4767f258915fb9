"""The claim loop: a thread of its own that claims invocations of the daemon's queues
for the free slots (long-polling when it has nothing to report), takes the outcomes
waiting along in one exchange, and hands what it claims to the spawner
(lakeshore.worker.slots). While jobs are short it claims ahead of the free slots (see
the package's docstring, "Claiming ahead")."""

import random
import time

from lakeshore.client import long_poll, path, retry_after
from lakeshore.errors import ApiError
from lakeshore.pool.job_process import Running
from lakeshore.worker.calls import TOKEN_REVOKED, Stopped
from lakeshore.worker.heartbeat import STATE_HEADER
from lakeshore.worker.reporting import Outcome, read_answers

AHEAD_BELOW = 0.1  # claim ahead of free slots while jobs run shorter than this (s)
AHEAD_WAIT = 0.05  # ... as many as the slots run in about this long (s), at least one each
CLAIM_LIMIT_MAX = 100  # the most one claim may ask for (the server's limit)

# What this daemon runs: JSON invocations, and the Python SDK's @dls.udf calls
# (lakeshore.sdk_job), not the SDK's bare values, which only SyncQueue.claim handles.
WIRES = ["json", "envelope"]


class ClaimLoop:
    """The Worker's claiming (lakeshore.worker.daemon holds the state it uses)."""

    def _ahead(self) -> int:
        """How many to claim beyond the slots (lock held). While the last jobs ran
        shorter than AHEAD_BELOW seconds on average: as many as the slots get through in
        AHEAD_WAIT seconds, and at least one a slot (so a job claimed ahead waits for
        its slot about AHEAD_WAIT, or one short job's run, at most). None otherwise."""
        average = self.run_average
        if average is None or average >= AHEAD_BELOW:
            return 0
        through = int(self.concurrency * AHEAD_WAIT / max(average, 0.0005))
        return min(max(self.concurrency, through), CLAIM_LIMIT_MAX)

    def _free(self) -> int:
        """How many a claim may ask for now (lock held): free slots plus what may be
        claimed ahead, less what is held or asked for by a claim in flight."""
        return self.concurrency + self._ahead() - len(self.running) - self.reserved

    def _lane(self) -> None:
        try:
            self._claim_loop()
        except Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - raised on the spawner (_serve)
            self.lane_error = exc
            self.hard_stop.set()
        finally:
            with self.lock:
                self.slot_free.notify_all()

    def _claim_loop(self) -> None:
        try:
            while not self._should_stop():
                # A job that ends frees a slot, and the request this loop then sends
                # carries its outcome: the reporter leaves it to us.
                self.reporter.carry(self.daemon_id if self.exchange else None)
                with self.lock:
                    while self._free() <= 0 and not self._should_stop():
                        self.slot_free.wait(1.0)
                    free = min(self._free(), CLAIM_LIMIT_MAX)
                    busy = bool(self.running) or self.reserved > 0
                    if self._should_stop() or free <= 0:
                        continue
                    self.reserved += free
                failed_id = self.daemon_id
                asked = time.monotonic()
                try:
                    claimed = self._claim(failed_id, free, busy)
                except Stopped:
                    self._release(free, [], failed_id)
                    return
                except ApiError as exc:
                    self._release(free, [], failed_id)
                    if exc.status != 409 and exc.code != TOKEN_REVOKED:
                        raise
                    self.reporter.carry(None)  # registering again, or stopping
                    self._handle_not_live(exc, failed_id)
                    continue
                except BaseException:
                    self._release(free, [], failed_id)
                    raise
                self._release(free, claimed, failed_id)
                if claimed:
                    took = (time.monotonic() - asked) * 1000
                    self.debug(f"claimed {len(claimed)} (limit {free}) in {took:.0f} ms")
                self._claim_later()
        finally:
            self.reporter.carry(None)  # what ends from now on is the reporter's to send

    def _release(self, reserved: int, claimed: list[dict], daemon_id: str | None) -> None:
        """A claim's answer: its invocations are ours (running from now, started by the
        spawner), and the slots it asked for are free again. Once per claim."""
        with self.lock:
            self.reserved -= reserved
            for invocation in claimed:
                item = Running(invocation, daemon_id=daemon_id)
                self.running[item.id] = item
                self.arrived.append(item)
            self.slot_free.notify_all()

    def _claim(self, daemon_id: str | None, limit: int, busy: bool) -> list[dict]:
        """Claims up to `limit`. Outcomes waiting go with it in one exchange, which does
        not long-poll (their answers come at once; if it finds no work, the next claim
        waits for some): outcomes that end meanwhile wait for the next one. Without
        outcomes, a claim that long-polls: 2 s while jobs run, `claim_wait` when idle;
        outcomes that end meanwhile go on their own, after the linger."""
        batch = self.reporter.take(daemon_id) if self.exchange else []
        if batch:
            claimed = self._exchange(daemon_id, batch, limit)
            if claimed is not None:
                return claimed
        self.reporter.carry(None)
        url = path("daemons", daemon_id, "claim")
        wait = 2.0 if busy else self.claim_wait
        body = {"limit": limit, "wait": wait, "wires": WIRES}
        self.claim_in_flight = True
        try:
            answer = self.send("POST", url, body, give_up=self.draining, timeout=long_poll(wait))
            return self._claimed(answer)
        finally:
            self.claim_in_flight = False

    def _claimed(self, response) -> list | dict:
        """A claim's or an exchange's answer; its Retry-After (the server had no room
        for our long-poll) is kept for the claim loop."""
        self.claim_after = retry_after(response) or 0.0
        self.claim_answered = time.monotonic()  # the server saw us: heartbeat.py
        if response.headers.get(STATE_HEADER) == "draining":
            self.drain_asked()
        return self.client.decode(response)

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
        while not self._should_stop() and (left := until - time.monotonic()) > 0:
            self.draining.wait(min(left, 0.5))

    def _exchange(self, daemon_id: str | None, batch: list[Outcome], limit: int):
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
            answer = self._claimed(self.send("POST", url, body, give_up=self.draining))
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
        self._log_answers(batch, read_answers(batch, answer.get("recorded")))
        self.reporter.finished(batch)
        claimed = answer.get("claimed")
        return claimed if isinstance(claimed, list) else []
