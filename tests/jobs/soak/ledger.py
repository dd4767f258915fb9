"""What the threads of one soak run record and share: a thread-safe Counter of events
(Stats), each execution of an invocation's attempt (Run) in the ledger of side effects
as the daemon threads saw them (Ledger), and Shared, which holds both with the stop
event, the errors, the HTTP clients' settings and the threads' guard."""

import threading
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass

import httpx


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
