"""Pool: the job processes of one daemon, their settings and state; the spawner's side
(a warm process in every slot, an invocation handed to a process) and what any thread
may do (kill, signal, close). The monitor thread's side is lakeshore.pool.monitor."""

import contextlib
import os
import selectors
import threading
import time
from collections.abc import Callable

from lakeshore.joblog import to_daemon_log
from lakeshore.pool.job_process import JobProcess, Running
from lakeshore.pool.monitor import Done, Monitor, Output
from lakeshore.pool.template import Template

ISOLATIONS = ("pool", "process")


class Pool(Monitor):
    """The job processes of one daemon and the thread that watches them.

    `lock` is the daemon's (re-entrant) lock: the pool's state and the daemon's table of
    running invocations change together under it. `prepare` and `start` start
    processes: call them from the spawner thread only (see the package's docstring)."""

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
        output: Output | None = None,
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
        self.output = output or self.own_log
        self.processes: list[JobProcess] = []  # in service (pool: at most `size`)
        self.watched: set[JobProcess] = set()  # every process not yet reaped
        self.incoming: list[JobProcess] = []  # started, not yet in the selector
        self.closing = False
        self.started = 0  # processes started, for figures and tests
        # Process isolation: the warm template each job process is forked from (None:
        # not started yet, or none can run here and each job gets a fresh interpreter).
        self.template: Template | None = None
        self.template_failed = False
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
        if self.isolation == "process":
            self._prepare_template()
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

    def _prepare_template(self) -> None:
        """Process isolation: the template running (started again if it died). Where
        none can run, each job gets a fresh interpreter, as it would without one."""
        if self.template_failed or self.closing:
            return
        if self.template is None:
            self.template = Template(
                self.environment(None), preload=self.allowed_modules, log=self.log
            )
        try:
            self.template.ensure()
        except OSError as exc:
            self.template_failed = True
            self.log(f"{exc}: each job process is a fresh interpreter")

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
        with self.lock:
            process = next((p for p in self.processes if self._idle(p)), None)
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

    def fork_ahead(self, count: int) -> None:
        """`count` invocations are about to start (spawner only). Process isolation
        forks their job processes now, in one exchange with the template (each
        `start` then takes one that has run nothing), rather than one exchange each
        as they start. A process that could not be made is left to `start`, which
        tries again and fails its invocation, saying why, if it cannot either."""
        self._check_spawner()
        if self.isolation != "process" or count <= 0 or self.closing:
            return
        self._prepare_template()
        if self.template is None or self.template_failed:
            return
        with self.lock:
            count -= sum(1 for p in self.processes if self._idle(p))
        if count <= 0:
            return
        envs = [self.environment(None) for _ in range(count)]  # the runner sets the id
        try:
            made = JobProcess.fork_many(envs, self.template)
        except OSError as exc:  # no template, no descriptors: each start tries alone
            self.debug(f"could not fork job processes ahead ({exc})")
            return
        for process in made:
            if isinstance(process, JobProcess):
                self._add(process)

    def _idle(self, process: JobProcess) -> bool:
        """Whether `process` may take an invocation now (lock held): a pool process
        between invocations, or a process forked ahead that has run none."""
        return process.current is None and (self.isolation == "pool" or process.tasks == 0)

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
        once = self.isolation == "process"
        if once:
            self._prepare_template()
        template = self.template if once and not self.template_failed else None
        process = JobProcess.start(self.environment(invocation), once=once, template=template)
        self._add(process)
        if self.isolation == "pool":
            self.debug(f"job process {process.pid} started")
        return process

    def _add(self, process: JobProcess) -> None:
        """A new process in service, watched by the monitor."""
        with self.lock:
            self.started += 1
            self.processes.append(process)
            self.watched.add(process)
            self.incoming.append(process)
        self._wake()

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
        if self.template is not None:
            self.template.stop()
        self.selector.close()
        for fd in (self.wake_read, self.wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)

    def own_log(self, item: Running | None, pid: int, stream: str, lines: list[str]) -> None:
        """Lines a job process printed, to the daemon's own log (without a log book, or
        lines no invocation of this daemon owns)."""
        whose = f"invocation {item.id}" if item is not None else f"job process {pid}"
        to_daemon_log(self.log, whose, stream, lines)

    def _retire(self, process: JobProcess) -> None:
        """Out of service (lock held): no new invocation goes to it; the slot is free
        for a new process."""
        process.killed = True
        with contextlib.suppress(ValueError):
            self.processes.remove(process)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: it will wake anyway
            os.write(self.wake_write, b"!")
