"""The daemon: registers, heartbeats, claims invocations of its queues, runs them in job
processes (`lakeshore.pool`, `lakeshore.runner`), and reports outcomes in batches. It
rides out server restarts (retries with back-off) and, on SIGTERM, stops claiming,
finishes what it runs and deregisters. HTTP only: no Django here.

Threads: the spawner (the thread running `Worker.run`, the only one that starts job
processes: it starts what the claim loop claimed, as slots free up), the claim loop,
the pool's monitor (learns of each outcome, exit and timeout at once), the
reporter (sends outcomes in batches: at REPORT_BATCH of them or REPORT_LINGER seconds
after the first, so the claim loop never waits on a report) and the heartbeat, which
carries the ids the daemon holds (running, or ended and not yet reported) so that the
server requeues work whose claim answer never arrived.

One request per job: a finished job frees a slot, so the claim loop is about to claim
again; it takes the outcomes waiting and sends them with its claim (POST …/exchange/:
recorded first, then the claim, which then does not long-poll). While the claim loop
is on its way to a request or in an exchange, outcomes wait for it rather than leave
after the linger (a full batch still leaves); while it long-polls (nothing to claim),
is stopping or registering, the reporter sends them on their own (POST …/complete/).
A server without exchange (404) gets complete and claim apart, as before. (Measured
with daemons in this process against gunicorn: 8 daemons × 1 slot, 177 vs 134 jobs/s
and half the requests; 1 daemon × 8 slots, 0.21 vs 0.35 requests a job and a third less
server CPU a job. Letting outcomes leave in parallel while an exchange is in flight
split the batches: more requests, fewer jobs/s.)

Claiming ahead: while the last jobs ran shorter than AHEAD_BELOW (0.1 s) on average, the
claim loop may hold more than its slots (as many more as the slots run in AHEAD_WAIT,
50 ms, and at least one a slot), so the slot a job frees while a claim is in flight
gets its next job at once, from the spawner, without waiting for that answer; the
claim then carries every outcome that ended during its round trip. No more than
`concurrency` jobs ever run at once; a job's time-out counts from its start; what is
claimed ahead is held (heartbeats name it) and is started even while draining. Long jobs
are never claimed ahead: one would wait behind another's whole run while another daemon
might be idle. (Measured with `make bench`'s server, one daemon × 8 slots, no-op jobs:
290 → 520 jobs/s, and half the server CPU a job, the batches being larger. Two claims
in flight at once, each for the slots free, made the batches small: 290 → 80 jobs/s.)

Dispatch safety: a job process must never outlive the daemon that claimed it, or the
reaper would hand the work to another daemon while the first copy still runs.

- Each job process leads a session (and process group) of its own, and asks the
  kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG). Linux sends that signal
  when the *thread* that forked the child exits, so only the thread running
  `Worker.run` (the spawner) starts job processes, pool processes included, and it
  kills them all before it returns. A kill -9 of the daemon kills its job processes too.
- Whenever the daemon stops a job (timeout, the server no longer counts it as ours,
  drop, hard stop), when it replaces a pool process, and when a job's process exits, it
  kills the process's whole group, so what the job started (grandchildren in the same
  group) dies with it; a pool process also kills, between invocations, the processes
  the one before left (and is then replaced). Known limit: a kill -9 of the daemon
  kills the job process, but not the children it started (PDEATHSIG is not inherited),
  nor anything that left the group (setsid).
- Job processes get a scrubbed environment (JOB_ENV, LAKESHORE_JOB_ENV): no server
  setting and no token reaches them through it. (A job runs as the daemon's user, so
  it could still read /proc/<daemon pid>/environ or the CLI's auth.yml; closing that
  needs jobs run as another user, which this daemon does not do.)
- The daemon branches on the server's error `code`, never on its message."""

import os
import random
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from lakeshore.client import Client, path, retry_after
from lakeshore.errors import ApiError, CliError
from lakeshore.pool import Pool, Running
from lakeshore.runner import parse_modules
from lakeshore.sdk_job import FinalError, ResultBlob
from lakeshore.worker.environment import JOB_ENV_EXTRA, job_env_names, job_environment

BACKOFF_START = 0.5
BACKOFF_MAX = 10.0

# The server's 409 codes the daemon acts on (lakeshore_admin.errors.CODES).
DAEMON_TERMINATED = "daemon_terminated"  # dropped or ended on the server: stop
DAEMON_LOST = "daemon_lost"  # the reaper gave our work away: kill it, register again
TOKEN_REVOKED = "token_revoked"  # noqa: S105 - an error code (401): the server ended us: stop
AHEAD_BELOW = 0.1  # claim ahead of free slots while jobs run shorter than this (s)
AHEAD_WAIT = 0.05  # ... as many as the slots run in about this long (s), at least one each
CLAIM_LIMIT_MAX = 100  # the most one claim may ask for (the server's limit)
EXEC_GRACE = 10.0  # seconds an invocation sent TERM or INT by an operator has to exit
EXEC_SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "KILL": signal.SIGKILL}
CLAIM_STALE = "claim_stale"  # a complete for a claim we no longer hold: log, no retry

# ---------------------------------------------------------------------------- logging

# What this daemon runs: JSON invocations, and the Python SDK's @dls.udf calls
# (lakeshore.sdk_job), not the SDK's bare values, which only SyncQueue.claim handles.
WIRES = ["json", "envelope"]
REPORT_BATCH = 50  # outcomes per complete request, at most (the server takes 1,000)
REPORT_LINGER = 0.005  # seconds a batch waits for company after its first outcome
HELD_MAX = 10_000  # ids a heartbeat carries at most (the server's limit)

_log_lock = threading.Lock()


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def stderr_log(message: str) -> None:
    with _log_lock:  # one write a line: threads' lines never interleave
        sys.stderr.write(f"{_stamp()} {message}\n")
        sys.stderr.flush()


class Stopped(Exception):
    """The daemon is shutting down while it waited for the server."""


# ---------------------------------------------------------------------------- reporting


@dataclass
class Outcome:
    item: Running
    state: str  # succeeded, failed, timeout
    result: object
    error: str
    took: float  # seconds from handing it out to its end
    at: float = 0.0  # when it ended (monotonic)

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
        batch = []
        while self.queue and len(batch) < self.batch and self.queue[0].item.daemon_id == daemon_id:
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


def _answers(batch: list[Outcome], answers) -> list[dict]:
    """The server's answers to a list of outcomes (complete's, exchange's `recorded`),
    one {"ok": bool, "why": str} per outcome."""
    if not isinstance(answers, list) or len(answers) != len(batch):
        why = f"the server's answer to {len(batch)} outcomes was not a list of as many"
        return [{"ok": False, "why": why}] * len(batch)
    out = []
    for answer in answers:
        if isinstance(answer, dict) and answer.get("ok"):
            out.append({"ok": True})
            continue
        error = answer.get("error") if isinstance(answer, dict) else None
        error = error if isinstance(error, dict) else {}
        why = _refusal(str(error.get("code") or ""), str(error.get("message") or "refused"))
        out.append({"ok": False, "why": why})
    return out


def _refusal(code: str, message: str, status: int | None = None) -> str:
    if code == CLAIM_STALE:
        return f"the claim was taken away: {message}"
    prefix = f"{status} " if status else ""
    return f"{prefix}{code or 'error'}: {message}"


# ---------------------------------------------------------------------------- the daemon


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
        isolation: str = "pool",
        max_tasks_per_worker: int = 100,
        max_worker_memory: float = 1024,
        allow_pickled: bool = False,
        report_batch: int = REPORT_BATCH,
        report_linger: float = REPORT_LINGER,
        log: Callable[[str], None] = stderr_log,
        debug: Callable[[str], None] | None = None,
    ):
        self.client = client
        self.bootstrap_token = client.token  # registers; the daemon's credential acts
        self.queues = queues
        self.concurrency = concurrency
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.heartbeat_interval = heartbeat_interval
        self.claim_wait = claim_wait
        self.isolation = isolation
        self.max_tasks_per_worker = max_tasks_per_worker
        self.max_worker_memory = max_worker_memory
        self.allow_pickled = allow_pickled
        self.log = log
        self.debug = debug or (lambda message: None)
        self.daemon_id: str | None = None
        self.running: dict[str, Running] = {}
        # Reentrant: request_stop (a signal handler, so on the main thread at any point
        # between bytecodes) takes it, possibly while the main thread holds it. The
        # pool's state changes under it too.
        self.lock = threading.RLock()
        self.slot_free = threading.Condition(self.lock)
        self.draining = threading.Event()  # no more claims; leave once idle
        self.dropped = threading.Event()  # the server terminated us: leave now
        self.hard_stop = threading.Event()
        self.counts = {"succeeded": 0, "failed": 0, "timeout": 0}
        self.counts_lock = threading.Lock()  # the reporter and the claim loop count
        self.requests = 0  # complete requests the reporter sent (retries not counted)
        self.exchange = True  # the server has …/exchange/ (False after a 404: apart)
        self.claim_after = 0.0  # a claim's Retry-After: the claim loop waits this first
        self.send_held = True  # heartbeats carry the ids we hold (see _held)
        self.register_lock = threading.Lock()
        # Read once at start: the modules jobs may run (sent to the runner with each
        # invocation) and the operator's extra names for the jobs' environment.
        self.allowed_modules = parse_modules(os.environ.get("LAKESHORE_ALLOWED_MODULES", ""))
        self.job_env_extra, refused = job_env_names(os.environ.get(JOB_ENV_EXTRA, ""))
        if refused:
            self.log(
                f"{JOB_ENV_EXTRA}: never passing {', '.join(refused)} to jobs "
                "(server settings and secrets stay with the daemon)"
            )
        self.spawner: threading.Thread | None = None  # the one thread that starts jobs
        self.reserved = 0  # asked for by the claim in flight
        self.arrived: deque[Running] = deque()  # claimed (so running), not yet started
        self.run_average: float | None = None  # seconds a job ran, a moving average
        self.lane_error: BaseException | None = None  # the claim loop's, raised by run
        self.pool: Pool | None = None
        self.reporter = Reporter(
            self._report, self._reported, batch=report_batch, linger=report_linger
        )

    # ------------------------------------------------------------------ HTTP with retries

    def call(
        self,
        method: str,
        url: str,
        json_body=None,
        *,
        give_up: threading.Event | None = None,
        token: str | None = None,
    ):
        """A request that rides out an unreachable or failing server (5xx) with
        exponential back-off. 4xx answers are raised: they are the server's word."""
        return self.client.decode(self.send(method, url, json_body, give_up=give_up, token=token))

    def send(
        self,
        method: str,
        url: str,
        json_body=None,
        *,
        give_up: threading.Event | None = None,
        token: str | None = None,
    ):
        """`call`, answering the response itself (its headers). `token`: this one
        request speaks with it (registering: the token the daemon started with)."""
        delay = BACKOFF_START
        while True:
            try:
                return self.client.send(method, url, json=json_body, token=token)
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
        """Register with the token we started with (again after the reaper marked us
        lost), then speak with the daemon's own credential the server answers: the
        starting token may register daemons but never acts as them."""
        body = {"name": self.name, "queues": self.queues}
        daemon = self.call(
            "POST",
            path("daemons", "register"),
            body,
            give_up=self.draining,
            token=self.bootstrap_token,
        )
        if daemon.get("token"):  # None: the token we started with is this daemon's own
            self.client.use_token(daemon["token"])
        self.daemon_id = str(daemon["id"])
        where = ", ".join(self.queues) if self.queues else "the default queue"
        self.log(f"registered daemon {self.daemon_id} ({self.name}) serving {where}")

    def run(self) -> int:
        # Job processes die when the thread that forked them exits (PR_SET_PDEATHSIG):
        # this thread starts them all (the claim loop, and the pool's processes) and
        # kills them all before it returns, so it outlives each of them.
        self.spawner = threading.current_thread()
        try:
            self.register()
        except Stopped:
            self.log("stopped before the server answered; nothing was registered")
            return 0
        self.pool = Pool(
            size=self.concurrency,
            isolation=self.isolation,
            environment=lambda invocation: job_environment(
                os.environ, self.job_env_extra, invocation
            ),
            done=self._done,
            lock=self.lock,
            spawner=self.spawner,
            allowed_modules=self.allowed_modules,
            allow_pickled=self.allow_pickled,
            max_tasks=self.max_tasks_per_worker,
            max_memory_mb=self.max_worker_memory,
            log=self.log,
            debug=self.debug,
            stopping=self.draining.is_set,
        )
        beat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        self.reporter.start()
        beat.start()
        try:
            self._serve()
            self._wait_for_running()
        finally:
            self.hard_stop.set()
            self._kill_all("daemon stopping")
            self.pool.close()
            self.reporter.close(5)
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
        except ApiError as exc:
            if exc.code == TOKEN_REVOKED:  # ended on the server (scale-down) meanwhile
                self.log(f"daemon {self.daemon_id} had already been ended on the server")
            else:
                self.log(f"could not deregister ({exc.message}); the server will mark it lost")
        except CliError as exc:
            self.log(f"could not deregister ({exc.message}); the server will mark it lost")

    # ------------------------------------------------------------------ claiming

    def _serve(self) -> None:
        """The claim loop runs on a thread of its own and hands what it claims to this
        thread, which starts it (this thread starts every job process: see run) as slots
        free up, until the loop has ended and nothing claimed is left to start. While
        jobs are short (see _ahead), the loop claims ahead of free slots, so a slot that
        frees while a claim is in flight has its next job at once. An error of the loop
        is raised here."""
        lane = threading.Thread(target=self._lane, name="claim", daemon=True)
        self.pool.prepare()  # a warm process in every slot before the work comes
        lane.start()
        while True:
            with self.lock:
                while True:
                    stopping = self.hard_stop.is_set() or self.dropped.is_set()
                    startable = [] if stopping else self._startable()
                    if startable or (not lane.is_alive() and (stopping or not self.arrived)):
                        break
                    self.slot_free.wait(0.5)
            if not startable:
                break
            for item in startable:
                self._start(item)
            with self.lock:
                warm = not self.arrived and self._free() > 0 and not self._should_stop()
            if warm:
                self.pool.prepare()  # refill slots whose process was replaced
        lane.join()
        if self.lane_error is not None:
            raise self.lane_error

    def _startable(self) -> list[Running]:
        """Claimed and still ours, up to the slots free now (lock held)."""
        while self.arrived and self.running.get(self.arrived[0].id) is not self.arrived[0]:
            self.arrived.popleft()  # let go before it started (the server took it back)
        started = len(self.running) - len(self.arrived)
        taken = []
        while self.arrived and started + len(taken) < self.concurrency:
            item = self.arrived.popleft()
            if self.running.get(item.id) is item:
                taken.append(item)
        return taken

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
        body = {"limit": limit, "wait": 2.0 if busy else self.claim_wait, "wires": WIRES}
        return self._claimed(self.send("POST", url, body, give_up=self.draining))

    def _claimed(self, response) -> list | dict:
        """A claim's or an exchange's answer; its Retry-After (the server had no room
        for our long-poll) is kept for the claim loop."""
        self.claim_after = retry_after(response) or 0.0
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
        self._log_answers(batch, _answers(batch, answer.get("recorded")))
        self.reporter.finished(batch)
        claimed = answer.get("claimed")
        return claimed if isinstance(claimed, list) else []

    def _should_stop(self) -> bool:
        return self.draining.is_set() or self.dropped.is_set() or self.hard_stop.is_set()

    def _start(self, item: Running) -> None:
        if threading.current_thread() is not self.spawner:
            raise RuntimeError("job processes are started by the thread running Worker.run")
        with self.lock:
            if self.running.get(item.id) is not item:
                return  # let go before it started (the server handed our work back)
            if item.abandoned:  # the server ended it before it started (a kill)
                del self.running[item.id]
                self.slot_free.notify_all()
                return
        invocation = item.invocation
        item.started = time.monotonic()  # its time-out counts from here
        self.log(
            f"invocation {item.id}: running {invocation['function']} "
            f"(attempt {invocation['attempts']})"
        )
        try:
            self.pool.start(item)
        except OSError as exc:  # no process could be started: the invocation fails
            self._done(item, "failed", None, f"could not start a job process: {exc}")

    # ------------------------------------------------------------------ outcomes

    def _done(self, item: Running, state: str, result, error: str) -> None:
        """An invocation ended (the pool's monitor, with the lock held): free its slot at
        once, and queue its outcome for the reporter unless it was abandoned."""
        with self.lock:  # from running to the reporter at once: always held (_held)
            if self.running.get(item.id) is not item:
                return  # already ended (killed and dropped by _kill_all)
            del self.running[item.id]
            self.slot_free.notify_all()
            if item.abandoned:
                return
            took = time.monotonic() - item.started
            average = self.run_average
            self.run_average = took if average is None else 0.8 * average + 0.2 * took
            self.reporter.put(Outcome(item, state, result, error, took))

    def _reported(self) -> None:
        with self.lock:
            self.slot_free.notify_all()  # _wait_for_running waits for the reports too

    def _report(self, batch: list[Outcome]) -> None:
        """Sends one batch (the reporter's thread). Retried whole after a 5xx or an
        unreachable server: the server answers a repeat of the same complete with 200.
        Each outcome is fenced alone: a stale one does not refuse the others."""
        url = path("daemons", batch[0].item.daemon_id, "complete")
        started = time.monotonic()
        requests = self.requests
        try:
            if len(batch) == 1:
                answers = [self._report_one(url, batch[0])]
            else:
                answers = self._report_many(url, batch)
        except ApiError as exc:  # for the whole request: daemon_terminated, daemon_lost
            why = _refusal(exc.code, exc.message, exc.status)
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
        self._log_answers(batch, answers)

    def _log_answers(self, batch: list[Outcome], answers: list[dict]) -> None:
        for outcome, answer in zip(batch, answers, strict=True):
            if answer.get("ok"):
                with self.counts_lock:
                    self.counts[outcome.state] += 1
                self.log(f"invocation {outcome.item.id}: {outcome.state} in {outcome.took:.2f} s")
            else:
                self.log(f"invocation {outcome.item.id}: outcome not recorded ({answer['why']})")

    def _report_one(self, url: str, outcome: Outcome) -> dict:
        self.requests += 1
        try:
            self.call("POST", url, outcome.body())
        except ApiError as exc:
            if exc.status in (404, 409):  # the server's word on this one outcome
                return {"ok": False, "why": _refusal(exc.code, exc.message, exc.status)}
            raise
        return {"ok": True}

    def _report_many(self, url: str, batch: list[Outcome]) -> list[dict]:
        self.requests += 1
        try:
            answers = self.call("POST", url, [outcome.body() for outcome in batch])
        except ApiError as exc:
            if exc.status != 400:
                raise
            # A server without batched completes (or one refusing the batch as a whole):
            # one request per outcome, each with its own answer.
            return [self._report_one(url, outcome) for outcome in batch]
        return _answers(batch, answers)

    def _wait_for_running(self) -> None:
        with self.lock:
            while (
                (self.running or self.reporter.pending())
                and not self.hard_stop.is_set()
                and not self.dropped.is_set()
            ):
                self.slot_free.wait(0.5)

    def _kill_all(self, why: str) -> None:
        """Kills every running invocation's process and forgets the invocation (not
        reported): on a hard stop, and when the server let go of this daemon."""
        with self.lock:
            items = list(self.running.values())
        for item in items:
            item.abandoned = True
            if self.pool is not None and self.pool.kill(item, wait=True):
                self.log(f"invocation {item.id}: stopping its process ({why})")
            with self.lock:
                if self.running.get(item.id) is item:
                    del self.running[item.id]
                self.slot_free.notify_all()

    # ------------------------------------------------------------------ heartbeat

    def _held(self) -> list[int] | None:
        """Every invocation this daemon holds: running, or ended and not yet reported
        (the server requeues running work of ours missing from it, after a grace: a
        claim whose answer never arrived). None if too many to send."""
        with self.lock:
            ids = {int(key) for key in self.running}
            ids.update(int(key) for key in self.reporter.pending_ids())
        return sorted(ids) if len(ids) <= HELD_MAX else None

    def _heartbeat(self) -> dict:
        url = path("daemons", self.daemon_id, "heartbeat")
        held = self._held() if self.send_held else None
        if held is None:
            return self.call("POST", url, give_up=self.hard_stop)
        try:
            return self.call("POST", url, {"held": held}, give_up=self.hard_stop)
        except ApiError as exc:
            if exc.status != 400:
                raise
            why = exc.message
        self.send_held = False  # a server that does not know `held`: beat without it
        self.log(f"the server refused held ids in heartbeats ({why}); sending none")
        return self.call("POST", url, give_up=self.hard_stop)

    def _heartbeat_loop(self) -> None:
        while not self.hard_stop.wait(self.heartbeat_interval):
            failed_id = self.daemon_id
            try:
                answer = self._heartbeat()
            except Stopped:
                return
            except ApiError as exc:
                if exc.status == 409 or exc.code == TOKEN_REVOKED:
                    try:
                        self._handle_not_live(exc, failed_id)
                    except Stopped:
                        return  # stopping while registering again
                    continue
                self.log(f"heartbeat refused: {exc.message}")
                continue
            self._reconcile(answer)

    def _obey(self, commands: list[dict]) -> None:
        """Operators' orders from a heartbeat's answer (daemon exec), each on a thread of
        its own: a TERM waits out its grace without holding up the heartbeats."""
        for command in commands:
            threading.Thread(
                target=self._carry_out, args=(command,), name="exec", daemon=True
            ).start()

    def _carry_out(self, command: dict) -> None:
        """Stops the invocation's process group: KILL at once; TERM or INT, then KILL if
        it still runs after EXEC_GRACE. The server already ended the invocation (killed),
        so its outcome is not reported. Says what it did, in the log and to the server."""
        invocation, wanted = str(command.get("invocation")), str(command.get("signal"))
        with self.lock:
            item = self.running.get(invocation)
            if item is not None:
                item.abandoned = True
                item.signalled_until = time.monotonic() + EXEC_GRACE
        if item is None:
            result = "it no longer ran here"
        elif wanted not in EXEC_SIGNALS:
            result = f"unknown signal {wanted!r}: stopped with KILL instead"
            self.pool.kill(item)
        elif wanted == "KILL":
            result = "SIGKILL sent to its process group" if self.pool.kill(item) else "gone"
        elif not self.pool.signal(item, EXEC_SIGNALS[wanted]):
            result = "its process had already ended"
        else:
            result = self._grace(item, wanted)
        order = f"daemon exec {command.get('verb')} {wanted}".strip()
        self.log(f"invocation {invocation}: stopped by {command.get('by')} ({order}): {result}")
        try:
            url = path("daemons", self.daemon_id, "commands", command.get("id"), "done")
            self.call("POST", url, {"result": result}, give_up=self.hard_stop)
        except (CliError, Stopped) as exc:
            self.log(f"could not tell the server command {command.get('id')} was done ({exc})")

    def _grace(self, item: Running, wanted: str) -> str:
        deadline = time.monotonic() + EXEC_GRACE
        with self.lock:
            while self.running.get(item.id) is item and time.monotonic() < deadline:
                self.slot_free.wait(0.1)
            ended = self.running.get(item.id) is not item
        if ended:
            return f"SIG{wanted} sent to its process group; it exited"
        self.pool.kill(item)
        return f"SIG{wanted} sent; still running after {EXEC_GRACE:g} s: SIGKILL"

    def _reconcile(self, answer: dict) -> None:
        """Stop local work the server no longer counts as ours (timed out, killed)."""
        self._obey(answer.get("commands") or [])
        theirs = set(answer.get("running", []))
        with self.lock:
            stale = [item for key, item in self.running.items() if key not in theirs]
        for item in stale:
            if time.monotonic() - item.started < 1.0:
                continue  # claimed after the server answered
            if item.signalled_until > time.monotonic():
                continue  # an operator's TERM or INT: its grace is not over
            item.abandoned = True
            if self.pool.kill(item):
                self.log(f"invocation {item.id}: the server ended it; stopping its process")
        if answer.get("state") == "draining" and not self.draining.is_set():
            self.log("the server asked this daemon to drain: finishing, then leaving")
            self.draining.set()
            with self.lock:
                self.slot_free.notify_all()

    def _handle_not_live(self, exc: ApiError, failed_id: str | None) -> None:
        """409 on heartbeat or claim: daemon_terminated (dropped) → leave; daemon_lost →
        the reaper gave our work away: kill our copies, register again, carry on."""
        with self.register_lock:
            if failed_id != self.daemon_id:
                return  # the other thread already handled it
            self._not_live(exc)

    def _not_live(self, exc: ApiError) -> None:
        if exc.code in (DAEMON_TERMINATED, TOKEN_REVOKED):
            if exc.code == TOKEN_REVOKED:  # a daemon's credential is revoked as it ends
                self.log(
                    f"daemon {self.daemon_id} was removed on the server (its credential is "
                    "revoked): stopping"
                )
            else:
                self.log(f"daemon {self.daemon_id} was removed on the server: stopping")
            self.dropped.set()
            self._kill_all("daemon removed")
            with self.lock:
                self.slot_free.notify_all()
            return
        if exc.code == DAEMON_LOST:
            self.log(f"daemon {self.daemon_id} was marked lost ({exc.message})")
        else:  # a 409 this daemon does not know: its work is not ours any more either
            self.log(f"daemon {self.daemon_id} refused ({exc.code or 'no code'}: {exc.message})")
        self._kill_all("its invocations were handed back by the server")
        if self._should_stop():
            self.log("not registering again: stopping")
            self.dropped.set()  # nothing left to finish; the server already let go of us
            with self.lock:
                self.slot_free.notify_all()
            return
        self.log("registering again")
        self.register()
