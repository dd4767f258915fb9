"""The slots and what runs in them: the spawner (the thread running Worker.run, the only
one that starts job processes) starts what the claim loop claimed as slots free up; an
invocation's end frees its slot and queues its outcome for the reporter; a stop kills
them all."""

import threading
import time

from lakeshore.pool.job_process import Running
from lakeshore.worker.logs import attempt_key
from lakeshore.worker.reporting import Outcome


class Slots:
    """The Worker's running jobs (lakeshore.worker.daemon holds the state they use)."""

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

    def _done(self, item: Running, state: str, result, error: str) -> None:
        """An invocation ended (the pool's monitor, with the lock held): free its slot at
        once, and queue its outcome for the reporter unless it was abandoned."""
        with self.lock:  # from running to the reporter at once: always held (_held)
            if self.running.get(item.id) is not item:
                return  # already ended (killed and dropped by _kill_all)
            del self.running[item.id]
            self.slot_free.notify_all()
            if item.abandoned:
                self.logbook.forget(attempt_key(item))
                return
            took = time.monotonic() - item.started
            average = self.run_average
            self.run_average = took if average is None else 0.8 * average + 0.2 * took
            outcome = Outcome(item, state, result, error, took)
            self.shipper.then_report(outcome)  # its last lines go first, if any wait
            self.reporter.put(outcome)

    def _output(self, item: Running | None, pid: int, stream: str, lines: list[str]) -> None:
        """Lines a job process printed (the pool's monitor): the invocation's log, or,
        printed between invocations or by one no longer ours, the daemon's own."""
        if item is None or item.abandoned:
            self.pool.own_log(item, pid, stream, lines)
            return
        self.logbook.add(attempt_key(item), item.daemon_id, stream, lines)

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
