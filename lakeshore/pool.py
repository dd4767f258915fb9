"""A daemon's job processes: started, fed, watched and stopped (used by lakeshore.worker).

Each job process runs `python -m lakeshore.runner` and speaks with the daemon over a
pipe pair of its own, one JSON line each way (see lakeshore.runner); its stdout and
stderr are the daemon's, so what a job prints goes to the daemon's log.

Isolation:

- "pool" (the default): each slot keeps a warm job process that runs invocations one
  after another. It is replaced after `max_tasks` invocations, after an invocation that
  failed (it may have left state behind), after one that left processes or threads
  running, when its resident memory (VmRSS) passes `max_memory_mb` after an
  invocation, and when it dies or is killed (timeout, stop). Replacements are started
  by the claim loop's thread before it claims (or when it hands out work).
- "process": a fresh process per invocation, started when the invocation is handed
  out, which ends when its process exits (as before pools).

Either way a job process leads a process group of its own, dies with the thread that
started it (PR_SET_PDEATHSIG: only the thread running Worker.run, which outlives them
all, starts them), has the scrubbed environment the daemon gives it, and whenever the daemon
stops one (timeout, drop, stop, replacement) or one exits, its whole group is killed.

One monitor thread learns of every outcome and every exit at once: a selector over the
processes' outcome pipes and their pidfds (exit), which also wakes for the nearest
timeout. It never starts a process."""

import contextlib
import ctypes
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lakeshore.sdk_job import FinalError, ResultBlob

ISOLATIONS = ("pool", "process")
RUNNER = "lakeshore.runner"
READ_CHUNK = 1 << 16

# ---------------------------------------------------------------------------- processes

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
# Signals a job process gets from outside when its whole unit is stopped (the daemon
# itself never sends SIGTERM or SIGINT to a job; a SIGKILL of its own marks it killed).
STOPPED_FROM_OUTSIDE = {int(signal.SIGTERM), int(signal.SIGINT), int(signal.SIGKILL)}


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


def start_job_process(
    command: list[str], env: dict, *, stdin=subprocess.PIPE, pass_fds=()
) -> subprocess.Popen:
    """A job process that dies with the calling thread (and so with the daemon) and
    leads a process group of its own (see kill_job_group)."""
    return subprocess.Popen(  # noqa: S603 - our own runner, no shell
        command,
        stdin=stdin,
        text=True,
        env=env,
        pass_fds=pass_fds,
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


def resident_mb(pid: int) -> float | None:
    """VmRSS of `pid` in MB, from /proc/PID/status (None: unknown)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class Running:
    """An invocation this daemon runs."""

    invocation: dict
    daemon_id: str | None = None  # the registration that claimed it (reports go there)
    started: float = field(default_factory=time.monotonic)
    abandoned: bool = False  # the server no longer counts it as ours: stop, don't report
    process: "JobProcess | None" = None
    signalled_until: float = 0.0  # an operator's TERM/INT: its grace ends then (monotonic)

    @property
    def id(self) -> str:
        return str(self.invocation["id"])

    @property
    def deadline(self) -> float | None:
        timeout_s = self.invocation.get("timeout_s")
        return self.started + float(timeout_s) if timeout_s else None


class JobProcess:
    """One `lakeshore.runner` process and its pipes. Only the monitor thread reads its
    pipe and closes its descriptors; any thread may kill it."""

    def __init__(self, process: subprocess.Popen, to_runner: int, from_runner: int, once: bool):
        self.process = process
        self.to_runner = to_runner  # we write invocations here (blocking)
        self.from_runner = from_runner  # outcomes come here (non-blocking)
        self.once = once
        self.pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):  # no pidfd: EOF means exit
            self.pidfd = os.pidfd_open(process.pid)
        self.buffer = bytearray()
        self.current: Running | None = None
        self.outcome: dict | None = None  # once: read before the exit that ends it
        self.tasks = 0
        self.killed = False  # out of service: killed, or on its way out
        self.closed = False
        self.io = threading.Lock()  # send against close
        self.sent: str | None = None  # the id of the last invocation written to it

    @classmethod
    def start(cls, env: dict, *, once: bool) -> "JobProcess":
        runner_in, to_runner = os.pipe()
        from_runner, runner_out = os.pipe()
        command = [sys.executable, "-m", RUNNER, "--in", str(runner_in), "--out", str(runner_out)]
        try:
            process = start_job_process(
                [*command, "--once"] if once else command,
                env,
                stdin=subprocess.DEVNULL,  # a job that reads stdin finds nothing
                pass_fds=(runner_in, runner_out),
            )
        except BaseException:
            os.close(to_runner)
            os.close(from_runner)
            raise
        finally:
            os.close(runner_in)
            os.close(runner_out)
        os.set_blocking(from_runner, False)
        return cls(process, to_runner, from_runner, once)

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, message: dict, item_id: str) -> bool:
        """Hands it an invocation; False if it is gone (it never got it). Holds `io`,
        so the monitor cannot close the descriptor (whose number another pipe or socket
        could then take) while this writes to it, and knows afterwards whether the
        invocation went out (`sent`)."""
        data = json.dumps(message).encode() + b"\n"
        with self.io:
            if self.closed or self.to_runner < 0:
                return False
            try:
                while data:
                    data = data[os.write(self.to_runner, data) :]
            except OSError:  # BrokenPipeError: it died
                return False
            self.sent = item_id
            if self.once:
                self._close_input()
        return True

    def read(self) -> tuple[list[bytes], bool]:
        """The complete lines it wrote since the last read, and whether its end closed."""
        eof = False
        while True:
            try:
                chunk = os.read(self.from_runner, READ_CHUNK)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not chunk:
                eof = True
                break
            self.buffer += chunk
        lines = []
        while (end := self.buffer.find(b"\n")) >= 0:
            lines.append(bytes(self.buffer[:end]))
            del self.buffer[: end + 1]
        return lines, eof

    def kill(self) -> None:
        kill_job_group(self.process)

    def reap(self) -> int:
        """Kills its group, waits for it, closes its descriptors: its exit code. The
        group is killed while its leader is still unreaped (a zombie keeps the number)."""
        if self.closed:
            return self.process.wait()
        kill_job_group(self.process)
        code = self.process.wait()
        self.close()
        return code

    def _close_input(self) -> None:
        if self.to_runner >= 0:
            with contextlib.suppress(OSError):
                os.close(self.to_runner)
            self.to_runner = -1

    def close(self) -> None:
        with self.io:  # a write in progress ends first (EPIPE: the process is dead)
            if self.closed:
                return
            self.closed = True
            self._close_input()
            for fd in (self.from_runner, self.pidfd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)


# ---------------------------------------------------------------------------- the pool


Done = Callable[[Running, str, object, str], None]
"""done(item, state, result, error): an invocation ended (succeeded, failed, timeout),
called from the monitor thread with the lock held (or from the spawner, when no process
could take it); it must not block."""


class Pool:
    """The job processes of one daemon and the thread that watches them.

    `lock` is the daemon's (re-entrant) lock: the pool's state and the daemon's table of
    running invocations change together under it. `prepare` and `start` start
    processes: call them from the spawner thread only (see the module's docstring)."""

    def __init__(
        self,
        *,
        size: int,
        isolation: str = "pool",
        environment: Callable[[dict | None], dict],
        done: Done,
        lock: threading.RLock,
        spawner: threading.Thread,
        allowed_modules: tuple[str, ...] = (),
        allow_pickled: bool = False,
        max_tasks: int = 100,
        max_memory_mb: float = 1024,
        log: Callable[[str], None] = print,
        debug: Callable[[str], None] | None = None,
        stopping: Callable[[], bool] = lambda: False,
    ):
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}")
        self.size = size
        self.isolation = isolation
        self.environment = environment
        self.done = done
        self.lock = lock
        self.spawner = spawner
        self.allowed_modules = tuple(allowed_modules)
        self.allow_pickled = allow_pickled
        self.max_tasks = max_tasks
        self.max_memory_mb = max_memory_mb
        self.log = log
        self.debug = debug or (lambda message: None)
        self.stopping = stopping  # the daemon was told to stop (SIGTERM/SIGINT)
        self.processes: list[JobProcess] = []  # in service (pool: at most `size`)
        self.watched: set[JobProcess] = set()  # every process not yet reaped
        self.incoming: list[JobProcess] = []  # started, not yet in the selector
        self.closing = False
        self.started = 0  # processes started, for figures and tests
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.wake_read, selectors.EVENT_READ, None)
        self.monitor = threading.Thread(target=self._monitor_loop, name="monitor", daemon=True)
        self.monitor.start()

    # ------------------------------------------------------------------ the spawner's side

    def _check_spawner(self) -> None:
        if threading.current_thread() is not self.spawner:
            raise RuntimeError("job processes are started by the thread running Worker.run")

    def prepare(self) -> None:
        """Pool isolation: a warm process in every slot that has none (spawner only)."""
        self._check_spawner()
        if self.isolation != "pool":
            return
        while True:
            with self.lock:
                if self.closing or len(self.processes) >= self.size:
                    return
            try:
                self._spawn(None)
            except OSError as exc:
                self.log(f"could not start a job process ({exc}); trying again later")
                return

    def start(self, item: Running) -> None:
        """Runs `item` in an idle pool process, or a new process (spawner only). A warm
        process found dead when handed the invocation (so it never got it) is replaced
        and the invocation handed to a new one; a new one that dies before it gets the
        invocation ends it failed."""
        self._check_spawner()
        message = {k: item.invocation.get(k) for k in ("id", "function", "args", "kwargs")}
        message["attempt"] = item.invocation.get("attempts")
        message["allowed_modules"] = list(self.allowed_modules)
        if item.invocation.get("wire") == "envelope":  # the Python SDK's (lakeshore.sdk_job)
            message["wire"] = "envelope"
            message["args_blob"] = item.invocation.get("args_blob")
            message["allow_pickled"] = self.allow_pickled
        process = None
        if self.isolation == "pool":
            with self.lock:
                process = next((p for p in self.processes if p.current is None), None)
                if process is not None:
                    self._assign(process, item)
            if process is not None:
                if process.send(message, item.id) or not self._take_back(process, item):
                    return
                self.debug(f"job process {process.pid} was gone; starting another")
                if item.abandoned:  # stopped meanwhile: nothing to run
                    self.done(item, "failed", None, "stopped before it started")
                    return
        process = self._spawn(item.invocation if self.isolation == "process" else None)
        with self.lock:
            self._assign(process, item)
        if process.send(message, item.id) or not self._take_back(process, item):
            return
        process.kill()
        code = process.process.wait()
        why = f"the job process exited before it got the invocation (code {code})"
        self.done(item, "failed", None, why)

    def _take_back(self, process: JobProcess, item: Running) -> bool:
        """After a send that failed: True if `item` is still this process's (no one
        ended it meanwhile); the process is out of service either way."""
        with self.lock:
            self._retire(process)
            if process.current is not item:
                return False  # a timeout or a stop ended it meanwhile
            process.current = None
            return True

    def _assign(self, process: JobProcess, item: Running) -> None:
        process.current = item
        process.tasks += 1
        item.process = process
        item.started = time.monotonic()
        if item.deadline is not None:
            self._wake()  # the monitor's next timeout counts from now

    def _spawn(self, invocation: dict | None) -> JobProcess:
        process = JobProcess.start(self.environment(invocation), once=self.isolation == "process")
        with self.lock:
            self.started += 1
            self.processes.append(process)
            self.watched.add(process)
            self.incoming.append(process)
        self._wake()
        if self.isolation == "pool":
            self.debug(f"job process {process.pid} started")
        return process

    # ------------------------------------------------------------------ any thread

    def kill(self, item: Running, *, wait: bool = False) -> bool:
        """Kills the process running `item` (its whole group), if it still runs it;
        with `wait`, returns once it is dead. The monitor reaps it."""
        with self.lock:
            process = item.process
            if process is None or process.current is not item or process.killed:
                return False
            self._retire(process)
        process.kill()
        if wait:
            process.process.wait()
        self._wake()
        return True

    def signal(self, item: Running, signum: int) -> bool:
        """Sends `signum` to the process group running `item`, if it still runs it (an
        operator's order: daemon exec). The process's exit is reaped as usual."""
        with self.lock:
            process = item.process
            if process is None or process.current is not item or process.killed:
                return False
        try:
            os.killpg(process.pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def pids(self) -> list[int]:
        with self.lock:
            return [p.pid for p in self.processes]

    def close(self) -> None:
        """Kills every process, stops the monitor, releases everything."""
        with self.lock:
            self.closing = True
            everything = list(self.watched)
            for process in everything:
                self._retire(process)
        for process in everything:
            process.kill()
        self._wake()
        if self.monitor is not threading.current_thread():
            self.monitor.join(10)
        for process in everything:
            process.reap()
        self.selector.close()
        for fd in (self.wake_read, self.wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _retire(self, process: JobProcess) -> None:
        """Out of service (lock held): no new invocation goes to it; the slot is free
        for a new process."""
        process.killed = True
        with contextlib.suppress(ValueError):
            self.processes.remove(process)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: it will wake anyway
            os.write(self.wake_write, b"!")

    # ------------------------------------------------------------------ the monitor

    def _monitor_loop(self) -> None:
        while True:
            with self.lock:
                if self.closing:
                    return
                incoming, self.incoming = self.incoming, []
                deadline = min(
                    (
                        p.current.deadline
                        for p in self.watched
                        if p.current is not None and p.current.deadline is not None
                    ),
                    default=None,
                )
            for process in incoming:
                self._watch(process)
            timeout = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            for key, _ in self.selector.select(timeout):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError, OSError):
                        while os.read(self.wake_read, 4096):
                            pass
                    continue
                kind, process = key.data
                if process.closed:
                    continue
                if kind == "out":
                    lines, eof = process.read()
                    for line in lines:
                        self._on_line(process, line)
                    if eof and process.pidfd is None:
                        self._on_exit(process)
                    elif eof:
                        self._unwatch_output(process)
                else:
                    self._on_exit(process)
            self._check_deadlines()

    def _watch(self, process: JobProcess) -> None:
        if process.closed:
            return
        self.selector.register(process.from_runner, selectors.EVENT_READ, ("out", process))
        if process.pidfd is not None:
            self.selector.register(process.pidfd, selectors.EVENT_READ, ("exit", process))

    def _unwatch_output(self, process: JobProcess) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(process.from_runner)

    def _unwatch(self, process: JobProcess) -> None:
        for fd in (process.from_runner, process.pidfd):
            if fd is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(fd)

    def _on_line(self, process: JobProcess, line: bytes) -> None:
        try:
            outcome = json.loads(line)
            if not isinstance(outcome, dict):
                raise ValueError("not an object")
        except ValueError:
            outcome = {"ok": False, "error": "the job process sent something that is not JSON"}
        with self.lock:
            item = process.current
            if item is None or str(outcome.get("id")) != item.id:
                why = "an outcome for no invocation it runs"
                self.log(f"job process {process.pid}: {why}; replacing it")
                self._retire(process)
                retire = why
            elif process.once:
                process.outcome = outcome  # the invocation ends when its process exits
                return
            else:
                process.current = None
                retire = self._why_retire(process, outcome)
                if retire:
                    self._retire(process)
                self._deliver(item, outcome)
        if retire:
            self.debug(f"job process {process.pid} replaced ({retire})")
            process.kill()  # the monitor reaps it at its exit

    def _why_retire(self, process: JobProcess, outcome: dict) -> str:
        if process.killed:
            return "stopped"
        if not outcome.get("ok"):
            return "the invocation failed"
        if outcome.get("leftovers"):
            return "; ".join(str(r) for r in outcome["leftovers"])
        if self.max_tasks and process.tasks >= self.max_tasks:
            return f"it ran {process.tasks} invocations"
        if self.max_memory_mb:
            rss = resident_mb(process.pid)
            if rss is not None and rss > self.max_memory_mb:
                return f"{rss:.0f} MB resident, above {self.max_memory_mb:g} MB"
        return ""

    def _deliver(self, item: Running, outcome: dict) -> None:
        if outcome.get("ok") and "result_blob" in outcome:
            self.done(item, "succeeded", ResultBlob(outcome["result_blob"]), "")
        elif outcome.get("ok"):
            self.done(item, "succeeded", outcome.get("result"), "")
        else:
            error = str(outcome.get("error") or "no error text")
            self.done(item, "failed", None, FinalError(error) if outcome.get("final") else error)

    def _on_exit(self, process: JobProcess) -> None:
        stopped = process.killed  # we killed it (or were replacing it): no news
        lines, _ = process.read()  # what it wrote before it exited
        for line in lines:
            self._on_line(process, line)
        code = self._reap(process)  # closes its pipe: a send from now on fails
        ordered = process.current is not None and process.current.abandoned  # not ours now
        if -code in STOPPED_FROM_OUTSIDE and not stopped and not ordered and not process.outcome:
            # The signal that stops a whole unit reaches the daemon about when it reaches
            # the job: give the daemon's own handler a moment to say it is stopping.
            deadline = time.monotonic() + 0.5
            while not self.stopping() and time.monotonic() < deadline:
                time.sleep(0.01)
        with self.lock:
            self._retire(process)
            item = process.current
            if item is not None and process.sent != item.id:
                return  # it never got it: the spawner hands it to another process
            process.current = None
            if item is None:
                if self.isolation == "pool" and not stopped and not self.closing:
                    self.log(f"job process {process.pid} exited (code {code}); replacing it")
                return
            if (
                process.outcome is None
                and -code in STOPPED_FROM_OUTSIDE
                and not stopped
                and self.stopping()
            ):
                # Whatever stopped the daemon stopped its job too (scancel, a Slurm time
                # limit, systemd's stop of the whole unit): not the invocation's failure.
                # It is not reported; the server hands it back when the daemon leaves.
                name = signal.Signals(-code).name
                self.log(
                    f"invocation {item.id}: its process was stopped by {name} from outside "
                    "while this daemon stops; the server will requeue it"
                )
                item.abandoned = True
                self.done(item, "failed", None, "")
                return
            outcome = process.outcome or {
                "ok": False,
                "error": f"the invocation's process exited with code {code}",
            }
            self._deliver(item, outcome)

    def _reap(self, process: JobProcess) -> int:
        self._unwatch(process)
        code = process.reap()
        with self.lock:
            self.watched.discard(process)
        return code

    def _check_deadlines(self) -> None:
        """Kills the process of each invocation past its timeout_s (its whole group) and
        ends the invocation as timeout; the process is reaped at its exit."""
        now = time.monotonic()
        with self.lock:
            for process in list(self.watched):
                item = process.current
                if item is None or item.deadline is None or item.deadline > now:
                    continue
                self._retire(process)
                process.current = None
                process.kill()
                timeout_s = item.invocation.get("timeout_s")
                self.done(item, "timeout", None, f"stopped after timeout_s={timeout_s} s")
