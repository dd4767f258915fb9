"""The daemon: registers, heartbeats, claims invocations of its queues, runs each in a
process of its own (`lakeshore.runner`), and reports outcomes. It rides out server
restarts (retries with back-off) and, on SIGTERM, stops claiming, finishes what it runs
and deregisters. HTTP only: no Django here.

Dispatch safety: a job process must never outlive the daemon that claimed it, or the
reaper would hand the work to another daemon while the first copy still runs.

- Each job process leads a session (and process group) of its own, and asks the
  kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG). Linux sends that signal
  when the *thread* that forked the child exits, so only the thread running
  `Worker.run` (the claim loop) starts job processes, and it kills them all before it
  returns. A kill -9 of the daemon kills its job processes too.
- Whenever the daemon stops a job (timeout, the server no longer counts it as ours,
  drop, hard stop), and when a job's process exits, it kills the job's whole process
  group, so what the job started (grandchildren in the same group) dies with it. Known
  limit: a kill -9 of the daemon kills the job process, but not the children it
  started (PDEATHSIG is not inherited), nor anything that left the group (setsid).
- Job processes get a scrubbed environment (JOB_ENV, LAKESHORE_JOB_ENV): no server
  setting and no token reaches them through it. (A job runs as the daemon's user, so
  it could still read /proc/<daemon pid>/environ or the CLI's auth.yml; closing that
  needs jobs run as another user, which this daemon does not do.)
- The daemon branches on the server's error `code`, never on its message."""

import contextlib
import ctypes
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
from lakeshore.runner import parse_modules

BACKOFF_START = 0.5
BACKOFF_MAX = 10.0

# The server's 409 codes the daemon acts on (lakeshore_admin.errors.CODES).
DAEMON_TERMINATED = "daemon_terminated"  # dropped or ended on the server: stop
DAEMON_LOST = "daemon_lost"  # the reaper gave our work away: kill it, register again
CLAIM_STALE = "claim_stale"  # a complete for a claim we no longer hold: log, no retry

# ---------------------------------------------------------------------------- job environment

JOB_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_*",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
)
"""The daemon's environment variables a job process inherits; nothing else passes.
A trailing `*` matches a prefix (LC_ALL, LC_CTYPE, ...). The daemon then sets
LAKESHORE_INVOCATION_ID and LAKESHORE_ATTEMPT for each job. An operator adds names with
LAKESHORE_JOB_ENV (comma-separated, exact names); names in JOB_ENV_NEVER or starting
with JOB_ENV_NEVER_PREFIXES are never passed, even if named there."""

JOB_ENV_NEVER_PREFIXES = ("LAKESHORE_", "DJANGO_", "DATABASE_", "CELERY_")
JOB_ENV_NEVER = frozenset(
    {
        # secrets
        "DATABASE_URL",
        "DJANGO_SECRET_KEY",
        "LAKESHORE_TOKEN",
        "LAKESHORE_CLIENT_TOKEN",
        "LAKESHORE_BROKER_URL",
        "PGPASSWORD",
        "PGPASSFILE",
        # the server's other settings (lakeshore_admin/settings.py)
        "ALLOWED_HOSTS",
        "CSRF_TRUSTED_ORIGINS",
        "XDG_CONFIG_HOME",  # where the CLI keeps auth.yml (the daemon's token)
    }
)
JOB_ENV_EXTRA = "LAKESHORE_JOB_ENV"


def _never_passed(name: str) -> bool:
    upper = name.upper()
    return upper in JOB_ENV_NEVER or upper.startswith(JOB_ENV_NEVER_PREFIXES)


def job_env_names(extra: str) -> tuple[list[str], list[str]]:
    """LAKESHORE_JOB_ENV's value → (names passed, names refused)."""
    names = [n.strip() for n in (extra or "").split(",") if n.strip()]
    return [n for n in names if not _never_passed(n)], [n for n in names if _never_passed(n)]


def job_environment(source: dict, extra_names: list[str], invocation: dict) -> dict:
    """The environment of one job process: JOB_ENV ∪ extra_names from `source`, minus
    anything never passed, plus this invocation's id and attempt."""
    exact = {n for n in JOB_ENV if not n.endswith("*")} | set(extra_names)
    prefixes = tuple(n[:-1] for n in JOB_ENV if n.endswith("*"))
    env = {
        name: value
        for name, value in source.items()
        if (name in exact or name.startswith(prefixes)) and not _never_passed(name)
    }
    env["LAKESHORE_INVOCATION_ID"] = str(invocation["id"])
    env["LAKESHORE_ATTEMPT"] = str(invocation.get("attempts", ""))
    return env


# ---------------------------------------------------------------------------- job processes

PR_SET_PDEATHSIG = 1


def _load_prctl():
    """libc's prctl, bound once here (before any thread starts): the child calls it
    between fork and exec, where loading a library could deadlock."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()
_SIGKILL = int(signal.SIGKILL)


def _die_with(parent: int) -> Callable[[], None]:
    """The job's preexec function: SIGKILL when the forking thread dies; and if the
    parent already died before the prctl took effect, exit at once. Runs in the forked
    child of a threaded process, so it does only async-signal-safe-ish work: a bound
    ctypes call, getppid, _exit."""

    def preexec() -> None:
        if _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0) != 0:
            os._exit(71)  # no parent-death signal: better not to run at all
        if os.getppid() != parent:
            os._exit(70)  # the daemon died between fork and prctl

    return preexec


def start_job_process(command: list[str], env: dict) -> subprocess.Popen:
    """A job process that dies with the calling thread (and so with the daemon) and
    leads a process group of its own (see kill_job_group). stdin is a pipe."""
    return subprocess.Popen(  # noqa: S603 - our own runner, no shell
        command,
        stdin=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=_die_with(os.getpid()),  # noqa: PLW1509 - see _die_with
    )


def kill_job_group(process: subprocess.Popen) -> None:
    """SIGKILL the job's whole process group (its session's: pgid == the job's pid), so
    the processes the job started die with it. The number stays the group's while any
    member or the unreaped leader exists; once the group is empty the call finds
    nothing (ESRCH), short of a full wrap of the pid space in between."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


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
        # Reentrant: request_stop (a signal handler, so on the main thread at any point
        # between bytecodes) takes it, possibly while the main thread holds it.
        self.lock = threading.RLock()
        self.slot_free = threading.Condition(self.lock)
        self.draining = threading.Event()  # no more claims; leave once idle
        self.dropped = threading.Event()  # the server terminated us: leave now
        self.hard_stop = threading.Event()
        self.counts = {"succeeded": 0, "failed": 0, "timeout": 0}
        self.register_lock = threading.Lock()
        # Read once at start: the modules jobs may run (sent to the runner in its
        # payload) and the operator's extra names for the jobs' environment.
        self.allowed_modules = parse_modules(os.environ.get("LAKESHORE_ALLOWED_MODULES", ""))
        self.job_env_extra, refused = job_env_names(os.environ.get(JOB_ENV_EXTRA, ""))
        if refused:
            self.log(
                f"{JOB_ENV_EXTRA}: never passing {', '.join(refused)} to jobs "
                "(server settings and secrets stay with the daemon)"
            )
        self.spawner: threading.Thread | None = None  # the one thread that starts jobs

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
        # Job processes die when the thread that forked them exits (PR_SET_PDEATHSIG):
        # this thread starts them all (the claim loop) and kills them all before it
        # returns, so it outlives each of them.
        self.spawner = threading.current_thread()
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
                self._handle_not_live(exc, failed_id)
                continue
            for invocation in claimed:
                self._start(invocation)

    def _should_stop(self) -> bool:
        return self.draining.is_set() or self.dropped.is_set() or self.hard_stop.is_set()

    def _start(self, invocation: dict) -> None:
        if threading.current_thread() is not self.spawner:
            raise RuntimeError("job processes are started by the thread running Worker.run")
        fd, outcome_path = tempfile.mkstemp(prefix="lakeshore-outcome-", suffix=".json")
        os.close(fd)
        process = start_job_process(
            [sys.executable, "-m", "lakeshore.runner", outcome_path],
            job_environment(os.environ, self.job_env_extra, invocation),
        )
        payload = {k: invocation.get(k) for k in ("function", "args", "kwargs")}
        payload["allowed_modules"] = list(self.allowed_modules)
        with contextlib.suppress(BrokenPipeError):  # it died at once: its exit code says so
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
                kill_job_group(item.process)
                item.process.wait()
                self._finish(item, "timeout", error=f"stopped after timeout_s={timeout_s} s")
            return
        kill_job_group(item.process)  # what the job left running ends with it
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
                    # Retried on 5xx/unreachable: the server answers a repeat of the
                    # same complete with 200.
                    self.call("POST", path("daemons", self.daemon_id, "complete"), body)
                    self.counts[state] += 1
                    took = time.monotonic() - item.started
                    self.log(f"invocation {item.id}: {state} in {took:.2f} s")
                except ApiError as exc:  # the server's word: not retried
                    if exc.code == CLAIM_STALE:
                        why = f"the claim was taken away: {exc.message}"
                    else:
                        why = f"{exc.status} {exc.code or 'error'}: {exc.message}"
                    self.log(f"invocation {item.id}: outcome not recorded ({why})")
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
            item.abandoned = True
            if item.process.poll() is None:
                self.log(f"invocation {item.id}: stopping its process ({why})")
            kill_job_group(item.process)  # also what an exited job left in its group
            item.process.wait()
            with self.lock:
                self.running.pop(item.id, None)
                self.slot_free.notify_all()

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
                    try:
                        self._handle_not_live(exc, failed_id)
                    except Stopped:
                        return  # stopping while registering again
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
            kill_job_group(item.process)
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
        if exc.code == DAEMON_TERMINATED:
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
