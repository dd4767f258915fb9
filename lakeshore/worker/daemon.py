"""The daemon, `Worker`: its settings and the state its threads share, set up here; its
methods come in groups from the modules beside this one (the package's docstring
tells the design). And `stderr_log`, the daemon's log."""

import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

from lakeshore.allow import parse_modules
from lakeshore.client import Client
from lakeshore.joblog import LogBook
from lakeshore.pool.job_process import Running
from lakeshore.pool.pool import Pool
from lakeshore.worker.calls import Calls
from lakeshore.worker.claim_loop import ClaimLoop
from lakeshore.worker.environment import JOB_ENV_EXTRA, job_env_names
from lakeshore.worker.heartbeat import Heartbeats
from lakeshore.worker.lifecycle import Lifecycle
from lakeshore.worker.logs import Shipper
from lakeshore.worker.reporting import REPORT_BATCH, REPORT_LINGER, Reporter, Reporting
from lakeshore.worker.slots import Slots

_log_lock = threading.Lock()


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def stderr_log(message: str) -> None:
    with _log_lock:  # one write a line: threads' lines never interleave
        sys.stderr.write(f"{_stamp()} {message}\n")
        sys.stderr.flush()


class Worker(Lifecycle, ClaimLoop, Slots, Reporting, Heartbeats, Calls):
    """A daemon. Its methods, by module: lifecycle (register, run, stop, deregister),
    claiming (the claim loop), slots (the spawner, starting and ending jobs), reporting
    (outcomes to the server), heartbeat (and operators' commands), calls (requests with
    retries)."""

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
        self.claim_answered = float("-inf")  # when a claim was last answered (monotonic)
        self.claim_in_flight = False  # a claim is out: the server holds it, so we are alive
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
        self.logbook = LogBook()  # what jobs print, waiting to be shipped
        self.shipper = Shipper(self.logbook, self.call, ready=self.reporter.mark_ready, log=log)
