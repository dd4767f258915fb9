"""A daemon thread works like the real daemon (lakeshore/worker/): it claims up to
CLAIM_LIMIT invocations with a long-poll, "runs" each one (records it in the ledger: a
Counter of runs per invocation and a (start, end, daemon) interval per run) and reports
the outcomes (tests/jobs/soak/reports.py). Its heartbeats carry the ids it holds ("held").
It rides out 5xx answers and connection errors with back-off, as the real daemon does,
and registers again as a new daemon after a 409 daemon_lost or daemon_terminated. The
chaos (tests/jobs/soak/chaos.py) makes it crash or stall."""

import random
import re
import threading
import time

import httpx

from tests.jobs.soak.http_calls import call, let_go
from tests.jobs.soak.ledger import Run, Shared
from tests.jobs.soak.reports import Reports

QUEUE = "soak"

CLAIM_LIMIT = 8  # invocations a claim asks for, as the real daemon's free slots
SMALL_CLAIM_RATE = 0.1  # a claim of one, now and then
SINGLE_EVERY = 8  # every 8th daemon thread reports one outcome a request; the rest, lists
HEARTBEAT_EVERY = 0.2  # s between looks
FRESH_FOR = 0.6  # s: no beat while a claim or report touched the daemon this recently
HELD_EVERY = 5.0  # s: a beat at least this often even when busy (its "held" list)
CLAIM_WAIT = 2.0  # s: long-poll
CRASH_PAUSE = (2.5, 3.5)  # s of silence after a crash (> the heartbeat timeout)


class DaemonThread(Reports):
    """One daemon: a claim/run/report thread and a heartbeat thread, one token."""

    def __init__(self, shared: Shared, index: int, token: str, seed: int):
        self.shared = shared
        self.index = index
        self.http = shared.client(token)
        self.rng = random.Random(seed)  # noqa: S311 - test chaos, not security
        self.lists = index % SINGLE_EVERY != SINGLE_EVERY - 1  # reports outcomes in lists
        self.lock = threading.Lock()
        self.daemon_id: int | None = None
        self.ids: list[int] = []  # every daemon id this thread registered, in order
        self.credentials: dict[int, str] = {}  # daemon id → its own credential
        self.gone: tuple[int, str] | None = None  # the heartbeat heard a 409 for this id
        self.held: set[int] = set()  # claimed, not yet answered: the heartbeat's "held"
        self.silent = threading.Event()  # crashed or stalled: no heartbeat
        self.crash = threading.Event()  # chaos: die now, like kill -9
        self.stall_for = 0.0  # chaos: freeze for this long while holding work
        self.fresh = 0.0  # when the server last touched this daemon (a claim, a report)
        self.generation = 0
        self.threads: list[threading.Thread] = []

    @property
    def holding(self) -> int:
        """Invocations claimed and not yet reported (or given up)."""
        with self.lock:
            return len(self.held)

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.threads = [
            self.shared.thread(self.run, f"daemon-{self.index}"),
            self.shared.thread(self.beat, f"heartbeat-{self.index}"),
        ]

    def join(self, timeout: float) -> bool:
        """Wait for both threads (after the test's stop); close the client once they end."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in self.threads):
            return False
        self.http.close()
        return True

    def _call(self, method, url, body=None, *, interruptible=True):
        give_up = self.crash.is_set if interruptible else None
        return call(
            self.shared,
            self.http,
            method,
            url,
            body,
            give_up=give_up,
            headers=self._speaking_for(url),
        )

    def _speaking_for(self, url: str) -> dict | None:
        """A daemon's requests go with its own credential (the register answer's
        token); registering goes with the thread's token."""
        found = re.match(r"daemons/(\d+)/", url)
        if found is None:
            return None
        return {"Authorization": f"Bearer {self.credentials[int(found.group(1))]}"}

    def register(self) -> bool:
        self.generation += 1
        body = {"name": f"soak-{self.index}-{self.generation}", "queues": [QUEUE]}
        response, _ = self._call("POST", "daemons/register/", body)
        if response is None:
            return False
        if response.status_code != 201:
            raise AssertionError(f"register: {response.status_code} {response.text}")
        with self.lock:
            self.daemon_id = int(response.json()["id"])
            self.credentials[self.daemon_id] = response.json()["token"]
            self.ids.append(self.daemon_id)
            self.gone = None
            self.held.clear()
            self.fresh = time.monotonic()
        if len(self.ids) > 1:
            self.shared.stats.add("registered again")
        return True

    def deregister(self) -> None:
        daemon = self.daemon_id
        if daemon is None:
            return
        for _ in range(3):
            try:
                url = f"daemons/{daemon}/deregister/"
                response = self.http.post(url, headers=self._speaking_for(url))
            except httpx.TransportError:
                continue
            if response.status_code == 200:
                self.shared.stats.add("deregistered")
                with self.lock:
                    self.daemon_id = None
                return
            if response.status_code < 500:
                return  # e.g. already ended on the server

    def _let_go(self, code: str) -> None:
        """The server let go of this daemon (409): forget it and what it held; register
        again next."""
        with self.lock:
            self.daemon_id = None
            self.gone = None
            self.held.clear()
        self.shared.stats.add(f"409 {code} seen")

    def _gone(self) -> str | None:
        with self.lock:
            if self.gone is not None and self.gone[0] == self.daemon_id:
                return self.gone[1]
        return None

    def _release(self, runs: list[Run]) -> None:
        """These were answered (or given up): no longer held."""
        with self.lock:
            self.held.difference_update(run.invocation for run in runs)

    # ---------------------------------------------------------------- the claim loop

    def run(self) -> None:
        try:
            while not self.shared.stop.is_set():
                if self.crash.is_set():
                    self._crash()
                    continue
                code = self._gone()
                if code:
                    self._let_go(code)
                if self.daemon_id is None:
                    self.register()
                    continue
                self._claim_and_work(self.daemon_id)
        finally:
            # After a crash there is nothing to deregister (daemon_id is None); a crash
            # the chaos asked for but this thread had not yet acted on never happened.
            self.deregister()

    def _claim_and_work(self, daemon: int) -> None:
        limit = 1 if self.rng.random() < SMALL_CLAIM_RATE else CLAIM_LIMIT
        body = {"limit": limit, "wait": CLAIM_WAIT}
        response, _ = self._call("POST", f"daemons/{daemon}/claim/", body)
        if response is None:
            return
        if let_go(response):
            self._let_go(let_go(response))
            return
        if response.status_code != 200:
            raise AssertionError(f"claim: {response.status_code} {response.text}")
        batch = response.json()
        if len(batch) > limit:
            raise AssertionError(f"a claim of {limit} answered {len(batch)}")
        if batch:  # the server touched the daemon just before answering
            self.fresh = time.monotonic()
        for item in batch:
            if item["state"] != "running" or item["worker"] != str(daemon):
                raise AssertionError(f"claim answered {item}")
            self.shared.ledger.claimed(daemon, int(item["id"]), item["attempts"])
        with self.lock:
            self.held.update(int(item["id"]) for item in batch)
        self.shared.stats.add("claims")
        self.shared.stats.add("claimed", len(batch))
        self._work(daemon, batch)

    def _work(self, daemon: int, batch: list[dict]) -> None:
        """Run the batch in order; a thread reporting in lists reports them together at
        the end (what ran before a crash is never reported, as after a kill -9)."""
        ledger, stats = self.shared.ledger, self.shared.stats
        done: list[Run] = []
        for n, item in enumerate(batch):
            if self.crash.is_set() or self._gone() or self.shared.stop.is_set():
                stats.add("claimed, dropped unstarted", len(batch) - n)
                break
            run = ledger.start(daemon, self.index, int(item["id"]), item["attempts"])
            stall, self.stall_for = self.stall_for, 0.0
            if stall:
                self.silent.set()  # frozen: no heartbeat either
                stats.add("stalls")
                self.shared.stop.wait(stall)
                self.silent.clear()
            time.sleep(self.rng.uniform(0, 0.003))  # the side effect itself
            run.end = time.monotonic()
            if self.crash.is_set():
                run.answer = "abandoned (crash)"
                stats.add("claimed, dropped unstarted", len(batch) - n - 1)
                break
            if self.lists:
                done.append(run)
            else:
                self._report_one(daemon, run)
        if not done:
            return
        if self.crash.is_set():
            for run in done:
                run.answer = "abandoned (crash)"
            stats.add("ran, never reported (crash)", len(done))
            return
        self._report_list(daemon, done)

    def _crash(self) -> None:
        """kill -9: what it held is abandoned unreported; silent; then a new daemon."""
        self.silent.set()
        self.shared.stats.add("crashes")
        with self.lock:
            self.daemon_id = None
            self.gone = None
            self.held.clear()
        self.shared.stop.wait(self.rng.uniform(*CRASH_PAUSE))
        self.crash.clear()
        self.silent.clear()

    # ---------------------------------------------------------------- heartbeat

    def beat(self) -> None:
        """A heartbeat with the ids it holds, when nothing touched the daemon for
        FRESH_FOR s (its claims and reports touch it too), and at least every
        HELD_EVERY s even when busy, so that the server hears what it holds."""
        last = time.monotonic()
        while not self.shared.stop.wait(HEARTBEAT_EVERY):
            now = time.monotonic()
            if self.silent.is_set():
                continue
            if now - self.fresh < FRESH_FOR and now - last < HELD_EVERY:
                continue
            with self.lock:
                daemon, held = self.daemon_id, sorted(self.held)
            if daemon is None:
                continue
            self.fresh = last = now
            self.shared.stats.add("requests: heartbeat")
            try:
                url = f"daemons/{daemon}/heartbeat/"
                response = self.http.post(url, json={"held": held}, headers=self._speaking_for(url))
            except httpx.TransportError:
                self.shared.stats.add("connection errors ridden out")
                continue
            if response.status_code >= 500:
                key = "503s ridden out" if response.status_code == 503 else "other 5xx ridden out"
                self.shared.stats.add(key)
                continue
            code = let_go(response)
            if code:
                with self.lock:
                    if self.daemon_id == daemon:
                        self.gone = (daemon, code)
                continue
            if response.status_code != 200:
                raise AssertionError(f"heartbeat: {response.status_code} {response.text}")
            if held:
                self.shared.stats.add("heartbeats with held ids")
