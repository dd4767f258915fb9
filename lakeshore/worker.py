"""The daemon: registers, heartbeats, claims invocations of its queues, runs each in a
process of its own (`lakeshore.runner`), and reports outcomes. It rides out server
restarts (retries with back-off) and, on SIGTERM, stops claiming, finishes what it runs
and deregisters. HTTP only: no Django here."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lakeshore.client import Client, path
from lakeshore.errors import ApiError, CliError

BACKOFF_START = 0.5
BACKOFF_MAX = 10.0


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def stderr_log(message: str) -> None:
    print(f"{_stamp()} {message}", file=sys.stderr, flush=True)


@dataclass
class Running:
    invocation: dict
    process: subprocess.Popen
    outcome_path: str
    started: float = field(default_factory=time.monotonic)
    abandoned: bool = False  # the server no longer counts it as ours: stop, don't report

    @property
    def id(self) -> str:
        return str(self.invocation["id"])


class Stopped(Exception):
    """The daemon is shutting down while it waited for the server."""


class Worker:
    def __init__(
        self,
        client: Client,
        *,
        queues: list[str],
        concurrency: int = 1,
        name: str | None = None,
        heartbeat_interval: float = 10.0,
        claim_wait: float = 5.0,
        log: Callable[[str], None] = stderr_log,
    ):
        self.client = client
        self.queues = queues
        self.concurrency = concurrency
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.heartbeat_interval = heartbeat_interval
        self.claim_wait = claim_wait
        self.log = log
        self.daemon_id: str | None = None
        self.running: dict[str, Running] = {}
        self.lock = threading.Lock()
        self.slot_free = threading.Condition(self.lock)
        self.draining = threading.Event()  # no more claims; leave once idle
        self.dropped = threading.Event()  # the server terminated us: leave now
        self.hard_stop = threading.Event()
        self.counts = {"succeeded": 0, "failed": 0, "timeout": 0}
        self.register_lock = threading.Lock()

    # ------------------------------------------------------------------ HTTP with retries

    def call(
        self, method: str, url: str, json_body=None, *, give_up: threading.Event | None = None
    ):
        """A request that rides out an unreachable or failing server (5xx) with
        exponential back-off. 4xx answers are raised: they are the server's word."""
        delay = BACKOFF_START
        while True:
            try:
                return self.client.request(method, url, json=json_body)
            except ApiError as exc:
                if exc.status < 500:
                    raise
                problem = f"server error {exc.status}: {exc.message}"
            except CliError as exc:  # unreachable, timed out, not JSON
                problem = exc.message
            if (give_up and give_up.is_set()) or self.hard_stop.is_set():
                raise Stopped(problem)
            self.log(f"{problem}; retrying in {delay:.1f} s")
            (give_up or self.hard_stop).wait(delay)
            delay = min(delay * 2, BACKOFF_MAX)

    # ------------------------------------------------------------------ lifecycle

    def register(self) -> None:
        body = {"name": self.name, "queues": self.queues}
        daemon = self.call("POST", path("daemons", "register"), body, give_up=self.draining)
        self.daemon_id = str(daemon["id"])
        where = ", ".join(self.queues) if self.queues else "the default queue"
        self.log(f"registered daemon {self.daemon_id} ({self.name}) serving {where}")

    def run(self) -> int:
        try:
            self.register()
        except Stopped:
            self.log("stopped before the server answered; nothing was registered")
            return 0
        beat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        reporter = threading.Thread(target=self._reporter_loop, name="reporter", daemon=True)
        beat.start()
        reporter.start()
        try:
            self._claim_loop()
            self._wait_for_running()
        finally:
            self.hard_stop.set()
            self._kill_all("daemon stopping")
            reporter.join(5)
            if not self.dropped.is_set():
                self._deregister()
        summary = ", ".join(f"{n} {state}" for state, n in self.counts.items())
        self.log(f"daemon {self.daemon_id} stopped ({summary})")
        return 0

    def request_stop(self, signum=None, frame=None) -> None:
        """First SIGTERM/SIGINT: finish current work. Second: stop it now."""
        if self.draining.is_set():
            self.log("second signal: stopping running invocations now")
            self.hard_stop.set()
            with self.lock:
                self.slot_free.notify_all()
            return
        self.log("stopping: no more claims; finishing running invocations (signal again to abort)")
        self.draining.set()
        with self.lock:
            self.slot_free.notify_all()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def _deregister(self) -> None:
        try:
            self.client.request("POST", path("daemons", self.daemon_id, "deregister"))
            self.log(f"deregistered daemon {self.daemon_id}")
        except CliError as exc:
            self.log(f"could not deregister ({exc.message}); the server will mark it lost")

    # ------------------------------------------------------------------ claiming

    def _claim_loop(self) -> None:
        while not (self.draining.is_set() or self.dropped.is_set() or self.hard_stop.is_set()):
            with self.lock:
                while len(self.running) >= self.concurrency and not self._should_stop():
                    self.slot_free.wait(1.0)
                free = self.concurrency - len(self.running)
                busy = bool(self.running)
            if self._should_stop() or free <= 0:
                continue
            failed_id = self.daemon_id
            try:
                claimed = self.call(
                    "POST",
                    path("daemons", self.daemon_id, "claim"),
                    {"limit": free, "wait": 2.0 if busy else self.claim_wait},
                    give_up=self.draining,
                )
            except Stopped:
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
                if self._should_stop() and "terminated" not in exc.message:
                    return  # stopping anyway; nothing to re-register for
                self._handle_not_live(exc, failed_id)
                continue
            for invocation in claimed:
                self._start(invocation)

    def _should_stop(self) -> bool:
        return self.draining.is_set() or self.dropped.is_set() or self.hard_stop.is_set()

    def _start(self, invocation: dict) -> None:
        fd, outcome_path = tempfile.mkstemp(prefix="lakeshore-outcome-", suffix=".json")
        os.close(fd)
        process = subprocess.Popen(
            [sys.executable, "-m", "lakeshore.runner", outcome_path],
            stdin=subprocess.PIPE,
            text=True,
        )
        payload = {k: invocation.get(k) for k in ("function", "args", "kwargs")}
        process.stdin.write(json.dumps(payload))
        process.stdin.close()
        with self.lock:
            self.running[str(invocation["id"])] = Running(invocation, process, outcome_path)
        self.log(
            f"invocation {invocation['id']}: running {invocation['function']} "
            f"(attempt {invocation['attempts']})"
        )

    # ------------------------------------------------------------------ reporting

    def _reporter_loop(self) -> None:
        while not self.hard_stop.is_set():
            with self.lock:
                items = list(self.running.values())
            for item in items:
                self._check(item)
            time.sleep(0.05)

    def _check(self, item: Running) -> None:
        timeout_s = item.invocation.get("timeout_s")
        code = item.process.poll()
        if code is None:
            if timeout_s and time.monotonic() - item.started > timeout_s:
                item.process.kill()
                item.process.wait()
                self._finish(item, "timeout", error=f"stopped after timeout_s={timeout_s} s")
            return
        outcome = self._read_outcome(item, code)
        if outcome.get("ok"):
            self._finish(item, "succeeded", result=outcome.get("result"))
        else:
            self._finish(item, "failed", error=outcome.get("error", "no error text"))

    def _read_outcome(self, item: Running, code: int) -> dict:
        try:
            with open(item.outcome_path) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return {"ok": False, "error": f"the invocation's process exited with code {code}"}

    def _finish(self, item: Running, state: str, *, result=None, error: str = "") -> None:
        try:
            if not item.abandoned:
                body = {
                    "invocation": int(item.id),
                    "attempt": item.invocation["attempts"],
                    "state": state,
                    "result": result,
                    "error": error,
                }
                try:
                    self.call("POST", path("daemons", self.daemon_id, "complete"), body)
                    self.counts[state] += 1
                    took = time.monotonic() - item.started
                    self.log(f"invocation {item.id}: {state} in {took:.2f} s")
                except ApiError as exc:  # 409: our claim was taken away meanwhile
                    self.log(f"invocation {item.id}: outcome not recorded ({exc.message})")
                except Stopped:
                    self.log(f"invocation {item.id}: outcome not reported (stopping)")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(item.outcome_path)
            with self.lock:
                self.running.pop(item.id, None)
                self.slot_free.notify_all()

    def _wait_for_running(self) -> None:
        with self.lock:
            while self.running and not self.hard_stop.is_set() and not self.dropped.is_set():
                self.slot_free.wait(0.5)

    def _kill_all(self, why: str) -> None:
        with self.lock:
            items = list(self.running.values())
        for item in items:
            if item.process.poll() is None:
                self.log(f"invocation {item.id}: stopping its process ({why})")
                item.abandoned = True
                item.process.kill()
                item.process.wait()
            with self.lock:
                self.running.pop(item.id, None)

    # ------------------------------------------------------------------ heartbeat

    def _heartbeat_loop(self) -> None:
        while not self.hard_stop.wait(self.heartbeat_interval):
            failed_id = self.daemon_id
            try:
                answer = self.call(
                    "POST", path("daemons", self.daemon_id, "heartbeat"), give_up=self.hard_stop
                )
            except Stopped:
                return
            except ApiError as exc:
                if exc.status == 409:
                    self._handle_not_live(exc, failed_id)
                    continue
                self.log(f"heartbeat refused: {exc.message}")
                continue
            self._reconcile(answer)

    def _reconcile(self, answer: dict) -> None:
        """Stop local work the server no longer counts as ours (timed out, killed)."""
        theirs = set(answer.get("running", []))
        with self.lock:
            stale = [item for key, item in self.running.items() if key not in theirs]
        for item in stale:
            if time.monotonic() - item.started < 1.0:
                continue  # claimed after the server answered
            item.abandoned = True
            if item.process.poll() is None:
                self.log(f"invocation {item.id}: the server ended it; stopping its process")
                item.process.kill()
        if answer.get("state") == "draining" and not self.draining.is_set():
            self.log("the server asked this daemon to drain: finishing, then leaving")
            self.draining.set()
            with self.lock:
                self.slot_free.notify_all()

    def _handle_not_live(self, exc: ApiError, failed_id: str | None) -> None:
        """409 on heartbeat or claim: terminated (dropped) → leave; lost → the reaper
        gave our work away; register again and carry on."""
        with self.register_lock:
            if failed_id != self.daemon_id:
                return  # the other thread already handled it
            self._not_live(exc)

    def _not_live(self, exc: ApiError) -> None:
        if "terminated" in exc.message:
            self.log(f"daemon {self.daemon_id} was removed on the server: stopping")
            self.dropped.set()
            self._kill_all("daemon removed")
            with self.lock:
                self.slot_free.notify_all()
            return
        self.log(f"daemon {self.daemon_id} was marked lost ({exc.message}); registering again")
        self._kill_all("its invocations were handed back by the server")
        self.register()
