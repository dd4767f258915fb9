"""The threads that act on the daemons from outside: the chaos, which makes a daemon
thread crash, stall or be dropped through the API, and the reaper, which marks the
silent ones lost and hands their work back."""

import random
import threading

from django.db import InterfaceError, OperationalError, connection

from fleet import daemons
from tests.jobs.soak.daemon_thread import DaemonThread
from tests.jobs.soak.http_calls import call
from tests.jobs.soak.ledger import Shared

STALL = (2.6, 3.4)  # s a stalled thread holds its invocations without a sound


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
