"""The pool's monitor thread: one selector over every job process's outcome pipe, its
stdout and stderr, and its exit (pidfd), which also wakes for the nearest timeout. It
delivers outcomes, learns of exits, ends invocations past their timeout and retires the
processes that must go. It never starts a process.

What a job process prints belongs to the invocation it runs (`output`): before an
outcome is delivered, and when a process exits or is killed, its stdout and stderr are
read to their end first (the runner flushes both before it writes an outcome), so every
line an invocation printed is its own, up to a kill, and none reaches the next one."""

import contextlib
import json
import os
import selectors
import signal
import threading
import time
from collections.abc import Callable

from lakeshore.pool.job_process import JobProcess, Running
from lakeshore.pool.processes import STOPPED_FROM_OUTSIDE, resident_mb
from lakeshore.sdk_job import FinalError, ResultBlob

DRAIN_READS = 16  # reads of OUTPUT_READ_MAX bytes a stream, at most, when a job ends


Done = Callable[[Running, str, object, str], None]
"""done(item, state, result, error): an invocation ended (succeeded, failed, timeout),
called from the monitor thread with the lock held (or from the spawner, when no process
could take it); it must not block."""

Output = Callable[[Running | None, int, str, list[str]], None]
"""output(item, pid, stream, lines): lines a job process printed on stdout ("o") or
stderr ("e"), for the invocation it runs (None: printed between invocations); called
from the monitor thread, without the lock; it must not block."""


class Monitor:
    """The Pool's monitor thread. The state it reads and changes is the Pool's, set up by
    Pool.__init__ (lakeshore.pool.pool); it is declared here so that each use is typed."""

    lock: threading.RLock
    closing: bool
    incoming: list[JobProcess]
    watched: set[JobProcess]
    selector: selectors.BaseSelector
    wake_read: int
    isolation: str
    max_tasks: int
    max_memory_mb: float
    done: Done
    output: Output
    stopping: Callable[[], bool]
    log: Callable[[str], None]
    debug: Callable[[str], None]
    _retire: Callable[[JobProcess], None]

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
                if kind in process.output:  # its stdout or stderr
                    self._read_output(process, kind)
                elif kind == "out":
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
        for stream, fd in process.output.items():
            self.selector.register(fd, selectors.EVENT_READ, (stream, process))
        if process.pidfd is not None:
            self.selector.register(process.pidfd, selectors.EVENT_READ, ("exit", process))

    def _unwatch_output(self, process: JobProcess) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(process.from_runner)

    def _unwatch(self, process: JobProcess) -> None:
        for fd in (process.from_runner, process.pidfd, *process.output.values()):
            if fd is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(fd)

    def _read_output(self, process: JobProcess, stream: str) -> None:
        lines, closed = process.read_output(stream)
        if closed:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(process.output[stream])
        if lines:
            with self.lock:
                item = process.current
            self.output(item, process.pid, stream, lines)

    def _drain_output(self, process: JobProcess, item: Running | None) -> None:
        """Everything the process printed so far, and the rest of a line it left open,
        for `item` (the invocation it ran: it ended)."""
        for stream in process.output:
            for _ in range(DRAIN_READS):  # a child it left may go on printing: not forever
                lines, closed = process.read_output(stream)
                if lines:
                    self.output(item, process.pid, stream, lines)
                if closed or not lines:
                    break
        for stream, rest in process.line_ends().items():
            if rest:
                self.output(item, process.pid, stream, rest)

    def _on_line(self, process: JobProcess, line: bytes) -> None:
        try:
            outcome = json.loads(line)
            if not isinstance(outcome, dict):
                raise ValueError("not an object")
        except ValueError:
            outcome = {"ok": False, "error": "the job process sent something that is not JSON"}
        with self.lock:
            item = process.current
        self._drain_output(process, item)  # printed before the outcome: the invocation's
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
        with self.lock:
            item = process.current
        self._drain_output(process, item)  # up to its end (a kill: up to the kill)
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
                process.kill()
                self._drain_output(process, item)  # what it printed up to the kill
                process.current = None
                timeout_s = item.invocation.get("timeout_s")
                self.done(item, "timeout", None, f"stopped after timeout_s={timeout_s} s")
