"""The daemon, `Worker`: it builds its parts, each an object with its own state and a few
methods, and wires them together (the package's docstring tells the design); then it
registers, runs them until it stops, and deregisters. And `stderr_log`, the daemon's
log."""

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from lakeshore.allow import parse_modules
from lakeshore.client import Client
from lakeshore.errors import ApiError
from lakeshore.joblog import LogBook
from lakeshore.pool.job_process import Running
from lakeshore.pool.pool import Pool
from lakeshore.worker.calls import DAEMON_LOST, DAEMON_TERMINATED, TOKEN_REVOKED, Session, Stopped
from lakeshore.worker.claim_loop import ClaimLoop
from lakeshore.worker.environment import JOB_ENV_EXTRA, job_env_names, job_environment
from lakeshore.worker.heartbeat import Heartbeat
from lakeshore.worker.logs import Shipper, attempt_key
from lakeshore.worker.orders import Orders
from lakeshore.worker.reporting import REPORT_BATCH, REPORT_LINGER, Completer, Reporter
from lakeshore.worker.slots import Slots
from lakeshore.worker.stopping import Stopping

_log_lock = threading.Lock()


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def stderr_log(message: str) -> None:
    with _log_lock:  # one write a line: threads' lines never interleave
        sys.stderr.write(f"{_stamp()} {message}\n")
        sys.stderr.flush()


def _quiet(message: str) -> None:
    """The debug log when --verbose is off: nothing."""


class Worker:
    """A daemon. Its parts, and who owns what:

    - `stopping`: the stop flags every part reads; the Worker and the parts set them.
    - `session`: the daemon's id and credential on the server, and its requests.
    - `slots`: the invocations held and the one lock that guards them (lent to the job
      pool); every other part goes through its methods.
    - `claims`: the claim loop (a thread), which reserves room in the slots.
    - `reporter` (a thread) and `completer`: outcomes to the server, in batches.
    - `shipper` (a thread): what jobs print, shipped before their outcomes.
    - `heartbeat` (a thread) and `orders`: liveness, and operators' orders.

    The Worker itself registers (again, when the server marked it lost), runs the parts
    on the thread that calls `run` (the spawner: it starts every job process), stops on
    signals, and deregisters."""

    def __init__(
        self,
        client: Client,
        *,
        queues: list[str],
        concurrency: int = 1,
        name: str | None = None,
        heartbeat_interval: float = 10.0,
        claim_wait: float = 50.0,  # the server's longest (fleet/parked.CLAIM_WAIT_MAX)
        isolation: str = "pool",
        max_tasks_per_worker: int = 100,
        max_worker_memory: float = 1024,
        allow_pickled: bool = False,
        report_batch: int = REPORT_BATCH,
        report_linger: float = REPORT_LINGER,
        log: Callable[[str], None] = stderr_log,
        debug: Callable[[str], None] | None = None,
    ):
        self.queues = queues
        self.concurrency = concurrency
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.isolation = isolation
        self.max_tasks_per_worker = max_tasks_per_worker
        self.max_worker_memory = max_worker_memory
        self.allow_pickled = allow_pickled
        self.log = log
        self.debug = debug or _quiet
        # Read once at start: the modules jobs may run (sent to the runner with each
        # invocation) and the operator's extra names for the jobs' environment.
        self.allowed_modules = parse_modules(os.environ.get("LAKESHORE_ALLOWED_MODULES", ""))
        self.job_env_extra, refused = job_env_names(os.environ.get(JOB_ENV_EXTRA, ""))
        if refused:
            self.log(
                f"{JOB_ENV_EXTRA}: never passing {', '.join(refused)} to jobs "
                "(server settings and secrets stay with the daemon)"
            )
        self.register_lock = threading.Lock()  # one thread registers again at a time
        self.pool: Pool | None = None  # built by run, once registered

        self.stopping = Stopping()
        self.session = Session(client, stopping=self.stopping, log=log)
        self.completer = Completer(self.session, log=log, debug=self.debug)
        self.reporter = Reporter(
            self.completer.send, self._reported, batch=report_batch, linger=report_linger
        )
        self.logbook = LogBook()  # what jobs print, waiting to be shipped
        self.shipper = Shipper(
            self.logbook, self.session.call, ready=self.reporter.mark_ready, log=log
        )
        self.slots = Slots(
            concurrency,
            stopping=self.stopping,
            reporter=self.reporter,
            shipper=self.shipper,
            log=log,
        )
        self.claims = ClaimLoop(
            self.session,
            self.slots,
            self.reporter,
            self.completer,
            self.stopping,
            wait=claim_wait,
            not_live=self._handle_not_live,
            drain_asked=self.drain_asked,
            log=log,
            debug=self.debug,
        )
        self.orders = Orders(
            self.session, self.slots, self.stopping, log=log, killed=self.completer.count_killed
        )
        self.heartbeat = Heartbeat(
            self.session,
            self.slots,
            self.claims,
            self.orders,
            self.stopping,
            interval=heartbeat_interval,
            not_live=self._handle_not_live,
            drain_asked=self.drain_asked,
            log=log,
            debug=self.debug,
        )

    def register(self) -> None:
        """Registers (again, after the reaper marked us lost), and beats fast enough for
        the server's timeout."""
        daemon = self.session.register(self.name, self.queues, give_up=self.stopping.draining)
        where = ", ".join(self.queues) if self.queues else "the default queue"
        self.log(f"registered daemon {self.session.daemon_id} ({self.name}) serving {where}")
        self.heartbeat.renew_within(daemon.get("heartbeat_timeout"))

    def run(self) -> int:
        # Job processes die when the thread that forked them exits (PR_SET_PDEATHSIG):
        # this thread starts them all (what the claim loop claimed, and the pool's
        # processes) and kills them all before it returns, so it outlives each of them.
        spawner = threading.current_thread()
        try:
            self.register()
        except Stopped:
            self.log("stopped before the server answered; nothing was registered")
            return 0
        self.pool = Pool(
            size=self.concurrency,
            isolation=self.isolation,
            environment=self._job_environment,
            done=self.slots.end,
            lock=self.slots.lock,
            spawner=spawner,
            allowed_modules=self.allowed_modules,
            allow_pickled=self.allow_pickled,
            max_tasks=self.max_tasks_per_worker,
            max_memory_mb=self.max_worker_memory,
            log=self.log,
            debug=self.debug,
            stopping=self.stopping.draining.is_set,
            output=self._printed,
        )
        self.slots.open(self.pool, spawner)
        self.reporter.start()
        self.shipper.start()
        self.heartbeat.start()
        try:
            self.slots.prepare()  # a warm process in every slot before the work comes
            self.claims.start()
            self.slots.serve(claiming=self.claims.alive)
            self.claims.join()  # an error of the claim loop is raised here
            self.slots.wait_until_idle()
        finally:
            self.stopping.hard.set()
            self.slots.kill_all("daemon stopping")
            self.slots.close()
            self.shipper.close(5)  # the lines first: outcomes wait for theirs
            self.reporter.close(5)
            if not self.stopping.dropped.is_set():
                self.session.deregister()
        self.log(f"daemon {self.session.daemon_id} stopped ({self.completer.summary()})")
        return 0

    def request_stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        """First SIGTERM/SIGINT: finish current work. Second: stop it now."""
        if self.stopping.draining.is_set():
            self.log("second signal: stopping running invocations now")
            self.stopping.hard.set()
            self.slots.wake()
            return
        self.log("stopping: no more claims; finishing running invocations (signal again to abort)")
        self.stopping.draining.set()
        self.slots.wake()
        if self.session.daemon_id is not None:  # its waiting claim answers at once
            threading.Thread(target=self.heartbeat.tell_draining, name="drain", daemon=True).start()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def drain_asked(self) -> None:
        """The server asked this daemon to drain (a heartbeat's answer, or a claim's)."""
        if not self.stopping.draining.is_set():
            self.log("the server asked this daemon to drain: finishing, then leaving")
            self.stopping.draining.set()
            self.slots.wake()

    def _reported(self) -> None:
        """The reporter sent a batch: wake wait_until_idle, which waits for the reports."""
        self.slots.wake()

    def _job_environment(self, invocation: dict | None) -> dict[str, str]:
        return job_environment(os.environ, self.job_env_extra, invocation)

    def _printed(self, item: Running | None, pid: int, stream: str, lines: list[str]) -> None:
        """Lines a job process printed (the pool's monitor): the invocation's log, or,
        printed between invocations or by one no longer ours, the daemon's own."""
        if item is None or item.abandoned:
            if self.pool is not None:
                self.pool.own_log(item, pid, stream, lines)
            return
        self.logbook.add(attempt_key(item), item.daemon_id, stream, lines)

    def _handle_not_live(self, exc: ApiError, failed_id: str | None) -> None:
        """409 on heartbeat or claim: daemon_terminated (dropped) → leave; daemon_lost →
        the reaper gave our work away: kill our copies, register again, carry on."""
        with self.register_lock:
            if failed_id != self.session.daemon_id:
                return  # the other thread already handled it
            self._not_live(exc)

    def _not_live(self, exc: ApiError) -> None:
        daemon_id = self.session.daemon_id
        if exc.code in (DAEMON_TERMINATED, TOKEN_REVOKED):
            if exc.code == TOKEN_REVOKED:  # a daemon's credential is revoked as it ends
                self.log(
                    f"daemon {daemon_id} was removed on the server (its credential is "
                    "revoked): stopping"
                )
            else:
                self.log(f"daemon {daemon_id} was removed on the server: stopping")
            self.stopping.dropped.set()
            self.slots.kill_all("daemon removed")
            self.slots.wake()
            return
        if exc.code == DAEMON_LOST:
            self.log(f"daemon {daemon_id} was marked lost ({exc.message})")
        else:  # a 409 this daemon does not know: its work is not ours any more either
            self.log(f"daemon {daemon_id} refused ({exc.code or 'no code'}: {exc.message})")
        self.slots.kill_all("its invocations were handed back by the server")
        if self.stopping.any():
            self.log("not registering again: stopping")
            self.stopping.dropped.set()  # nothing left to finish; the server let go of us
            self.slots.wake()
            return
        self.log("registering again")
        self.register()
