"""The slots and what runs in them. `Slots` owns the daemon's table of the invocations
it holds (claimed, running, not yet ended) and the one lock that guards it, which it
lends to the job pool (the pool's state and the table change together). Every other
part asks it through its methods: the claim loop reserves room and hands over what it
claimed, the spawner (the thread running Worker.run, the only one that starts job
processes) starts what was claimed as slots free up, the pool's monitor ends what ran,
and the heartbeat and operators' orders find and stop invocations.

Claiming ahead: while the last jobs ran shorter than AHEAD_BELOW on average, a claim
may ask for more than the free slots, and waits for a batch's room while every slot
has its next job (see the package's docstring)."""

import threading
import time
from collections import deque
from collections.abc import Callable

from lakeshore.pool.job_process import Running
from lakeshore.pool.pool import Pool
from lakeshore.worker.logs import Shipper
from lakeshore.worker.reporting import Outcome, Reporter
from lakeshore.worker.stopping import Stopping

AHEAD_BELOW = 0.1  # claim ahead of free slots while jobs run shorter than this (s)
AHEAD_WAIT = 0.05  # ... as many as the slots run in about this long (s), at least one each
CLAIM_LIMIT_MAX = 100  # the most one claim may ask for (the server's limit)
BATCH_WAIT = 0.025  # seconds a claim waits for a batch's room while every slot has work


class Slots:
    """The invocations this daemon holds, and the `concurrency` slots they run in.

    An invocation is held from the claim's answer until it ended and its outcome went to
    the `reporter` (under the lock, so a heartbeat always names it: `held_ids`), or until
    the daemon let go of it. The `shipper` holds an outcome back while its job's last
    lines ship. Until `open` gives it the pool, nothing runs."""

    def __init__(
        self,
        concurrency: int,
        *,
        stopping: Stopping,
        reporter: Reporter,
        shipper: Shipper,
        log: Callable[[str], None],
    ):
        self.concurrency = concurrency
        self.stopping = stopping
        self.reporter = reporter
        self.shipper = shipper
        self.log = log
        # Reentrant: a signal handler (on the main thread, at any point between
        # bytecodes) wakes the waiters, possibly while the main thread holds it; the
        # pool's monitor calls `end` with it held.
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # a slot freed, work came, a stop
        self.running: dict[str, Running] = {}  # every invocation held, by id
        self.arrived: deque[Running] = deque()  # claimed (so held), not yet started
        self.reserved = 0  # asked for by the claim in flight
        self.run_average: float | None = None  # seconds a job ran, a moving average
        self.pool: Pool | None = None
        self.spawner: threading.Thread | None = None  # the one thread that starts jobs

    # ------------------------------------------------------------------ the spawner's side

    def open(self, pool: Pool, spawner: threading.Thread) -> None:
        """The pool that runs the jobs (built with this lock and `end`), and the thread
        that starts them all."""
        self.pool = pool
        self.spawner = spawner

    def close(self) -> None:
        """Kills every job process (what still runs is abandoned first: `kill_all`)."""
        if self.pool is not None:
            self.pool.close()

    def prepare(self) -> None:
        """A warm process in every slot before the work comes."""
        if self.pool is not None:
            self.pool.prepare()

    def serve(self, claiming: Callable[[], bool]) -> None:
        """Starts what the claim loop hands over, as slots free up, until the loop has
        ended (`claiming` answers False) and nothing claimed is left to start. While
        jobs are short (see `_ahead`), the loop claims ahead of free slots, so a slot
        that frees while a claim is in flight has its next job at once."""
        while True:
            with self.lock:
                while True:
                    leaving = self.stopping.leaving_now()
                    startable = [] if leaving else self._startable()
                    if startable or (not claiming() and (leaving or not self.arrived)):
                        break
                    self.changed.wait(0.5)
            if not startable:
                return
            if self.pool is not None:
                self.pool.fork_ahead(len(startable))
            for item in startable:
                self._start(item)
            with self.lock:
                warm = not self.arrived and self._free() > 0 and not self.stopping.any()
            if warm:
                self.prepare()  # refill slots whose process was replaced

    def wait_until_idle(self) -> None:
        """Returns once nothing runs and every outcome was answered, or on a hard stop
        or a drop."""
        with self.lock:
            while (self.running or self.reporter.pending()) and not self.stopping.leaving_now():
                self.changed.wait(0.5)

    def _startable(self) -> list[Running]:
        """Claimed and still ours, up to the slots free now (lock held)."""
        while self.arrived and self.running.get(self.arrived[0].id) is not self.arrived[0]:
            self.arrived.popleft()  # let go before it started (the server took it back)
        started = len(self.running) - len(self.arrived)
        taken: list[Running] = []
        while self.arrived and started + len(taken) < self.concurrency:
            item = self.arrived.popleft()
            if self.running.get(item.id) is item:
                taken.append(item)
        return taken

    def _start(self, item: Running) -> None:
        if threading.current_thread() is not self.spawner or self.pool is None:
            raise RuntimeError("job processes are started by the thread running Worker.run")
        with self.lock:
            if self.running.get(item.id) is not item:
                return  # let go before it started (the server handed our work back)
            if item.abandoned:  # the server ended it before it started (a kill)
                del self.running[item.id]
                self.changed.notify_all()
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
            self.end(item, "failed", None, f"could not start a job process: {exc}")

    # ------------------------------------------------------------------ the claim loop's side

    def reserve(self) -> tuple[int, bool]:
        """Waits until a claim may ask for some, and reserves them: (how many, whether
        anything is held or asked for already). (0, …) when the daemon stops. While
        every slot has its next job waiting, it waits for a batch's room (`_batch`),
        BATCH_WAIT at most from when some was free."""
        with self.lock:
            since: float | None = None  # when some room was first free
            while not self.stopping.any():
                free = self._free()
                if free <= 0:
                    self.changed.wait(1.0)
                    continue
                if free >= self._batch() or len(self.arrived) < self.concurrency:
                    break
                now = time.monotonic()
                since = now if since is None else since
                if now - since >= BATCH_WAIT:
                    break
                self.changed.wait(since + BATCH_WAIT - now)
            free = min(self._free(), CLAIM_LIMIT_MAX)
            busy = bool(self.running) or self.reserved > 0
            if self.stopping.any() or free <= 0:
                return 0, busy
            self.reserved += free
            return free, busy

    def claimed(self, reserved: int, invocations: list[dict], daemon_id: str | None) -> None:
        """A claim's answer: its invocations are held from now (started by the spawner),
        and the `reserved` slots it asked for are free again. Once per claim."""
        with self.lock:
            self.reserved -= reserved
            for invocation in invocations:
                item = Running(invocation, daemon_id=daemon_id)
                self.running[item.id] = item
                self.arrived.append(item)
            self.changed.notify_all()

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

    def _batch(self) -> int:
        """How much room a claim waits for while every slot has its next job waiting (lock
        held): half of what the slots and the claims ahead hold. A claim for a few at a time
        would cost a request each few jobs."""
        return max(1, (self.concurrency + self._ahead()) // 2)

    def _free(self) -> int:
        """How many a claim may ask for now (lock held): free slots plus what may be
        claimed ahead, less what is held or asked for by a claim in flight."""
        return self.concurrency + self._ahead() - len(self.running) - self.reserved

    # ------------------------------------------------------------------ the pool's side

    def end(self, item: Running, state: str, result: object, error: str) -> None:
        """An invocation ended (the pool's `done`: its monitor, with the lock held): free
        its slot at once, and hand its outcome to the reporter unless it was abandoned."""
        with self.lock:  # from held to the reporter at once: always named (held_ids)
            if self.running.get(item.id) is not item:
                return  # already ended (killed and dropped by kill_all)
            del self.running[item.id]
            self.changed.notify_all()
            if item.abandoned:
                self.shipper.forget(item)
                return
            took = time.monotonic() - item.started
            average = self.run_average
            self.run_average = took if average is None else 0.8 * average + 0.2 * took
            outcome = Outcome(item, state, result, error, took)
            self.shipper.then_report(outcome)  # its last lines go first, if any wait
            self.reporter.put(outcome)

    # ------------------------------------------------------------------ any thread

    def wake(self) -> None:
        """Wakes every waiter: a stop was asked, or an outcome was answered."""
        with self.lock:
            self.changed.notify_all()

    def held_ids(self) -> set[int]:
        """Every invocation held: running, or ended and not yet answered by the server."""
        with self.lock:
            ids = {int(key) for key in self.running}
            ids.update(int(key) for key in self.reporter.pending_ids())
        return ids

    def idle(self) -> bool:
        """Nothing held: nothing runs, and nothing waits to be reported."""
        with self.lock:
            return not self.running and not self.reporter.pending_ids()

    def let_go(self, invocation_id: str, *, grace: float) -> Running | None:
        """An operator's order stops `invocation_id`: it is abandoned (its outcome not
        reported) and, for `grace` seconds, no heartbeat stops it. None: not held."""
        with self.lock:
            item = self.running.get(invocation_id)
            if item is not None:
                item.abandoned = True
                item.signalled_until = time.monotonic() + grace
            return item

    def not_in(self, theirs: set[str]) -> list[Running]:
        """The invocations held here that the server does not name as ours."""
        with self.lock:
            return [item for key, item in self.running.items() if key not in theirs]

    def wait_for_end(self, item: Running, deadline: float) -> bool:
        """Waits until `item` ended or `deadline` (monotonic) passed: whether it ended."""
        with self.lock:
            while self.running.get(item.id) is item and time.monotonic() < deadline:
                self.changed.wait(0.1)
            return self.running.get(item.id) is not item

    def kill(self, item: Running) -> bool:
        """Kills the process group running `item`, if it still runs it."""
        return self.pool is not None and self.pool.kill(item)

    def signal(self, item: Running, signum: int) -> bool:
        """Sends `signum` to the process group running `item`, if it still runs it."""
        return self.pool is not None and self.pool.signal(item, signum)

    def kill_all(self, why: str) -> None:
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
                self.changed.notify_all()
