"""What every row module stands on: the systems' names, the budget of a run, a Row and
a Section, and the helpers that time a measurement. A Section groups rows that share a
preparation (the rows filled for the list pages; the N idle daemons of scale_rows.py,
one fleet run for all their rows). A Row maps each system that has the operation to a
function that makes one measurement and returns it in the row's unit; the runner
(__main__) calls each of them once per round, the systems in a rotated order each
round."""

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.compare.celery_driver import CeleryPeer
from bench.compare.rq_driver import RQPeer
from bench.compare.systems import Lakeshore, Procrastinate, RawSQL

LAKESHORE, RAW, PROCRASTINATE = Lakeshore.name, RawSQL.name, Procrastinate.name
CELERY, RQ = CeleryPeer.name, RQPeer.name
SYSTEMS = (LAKESHORE, RAW, PROCRASTINATE, CELERY, RQ)
PEERS = (PROCRASTINATE, CELERY, RQ)  # the job queues Lakeshore is compared with
JOBS_PER_S = "jobs/s"


@dataclass(frozen=True)
class Budget:
    rounds: int = 3
    submit_seconds: float = 3.0  # submit one at a time, per measurement
    floor_seconds: float = 2.0  # the floor under it (floor_app.py), per measurement
    batch_seconds: float = 2.0  # batches (at least one), per measurement
    batch_sizes: tuple[int, ...] = (10_000, 1_000)  # the largest the server takes is used
    claim_seconds: float = 1.5  # claim + complete, per measurement
    claim_backlog: dict = field(default_factory=lambda: {LAKESHORE: 5_000, RAW: 40_000})
    e2e_jobs: int = 1_000  # end to end: this many jobs, or e2e_seconds, whichever first
    e2e_seconds: float = 6.0
    # Celery's group sends one message a task (no bulk publish on Redis): its batch row
    # sends groups of at most this many, so that a round stays within the budget.
    celery_group: int = 1_000
    procrastinate_processes: int = 2  # its expert configuration: worker processes (cores)
    fleet_sizes: tuple[int, ...] = (500, 5_000)  # "N idle daemons" (BENCH_FLEET_SIZES)
    fleet_window: float = 20.0  # one window a round, the rounds back to back
    fleet_submits: int = 10  # jobs submitted one at a time a window (submit to claim)
    fleet_ramp_per_second: float = 200.0  # daemons registering a second, at most
    # Simulated daemons a generator process: about 1.8 ms of its CPU a request (httpx),
    # so 1,250 idle daemons keep one process near 60 % of a core.
    fleet_per_process: int = 1_250
    two_server_submits: int = 50  # a round of the two-server wake-up
    cancel_rows: int = 100_000
    list_sizes: tuple[int, ...] = (100_000, 1_000_000)
    list_samples: int = 10  # requests per page kind per round (median), within 2 s
    tick_queues: tuple[int, ...] = (100, 1_000, 10_000)  # a controller row for each
    tick_daemons_per_queue: int = 10
    claim_kind_seconds: float = 1.0  # queue_bench's per-kind claim figures
    # Stats and search (insight_rows.py): finished rows in the table (BENCH_INSIGHT_SIZES),
    # of which the same number ended in the last hour and in the last 24 hours at each size.
    insight_sizes: tuple[int, ...] = (1_000_000, 10_000_000)
    insight_hour_rows: int = 10_000
    insight_day_rows: int = 100_000
    insight_samples: int = 10  # requests a row a round (median), within 2 s

    @classmethod
    def quick(cls) -> "Budget":
        """BENCH_QUICK=1: a smoke run of every row in about a minute."""
        return cls(
            rounds=1,
            submit_seconds=0.5,
            floor_seconds=0.3,
            batch_seconds=0.5,
            claim_seconds=0.5,
            claim_backlog={LAKESHORE: 3_000, RAW: 10_000},
            e2e_jobs=50,
            e2e_seconds=3.0,
            celery_group=200,
            fleet_sizes=(100,),
            fleet_window=6.0,
            fleet_submits=5,
            two_server_submits=10,
            cancel_rows=5_000,
            list_sizes=(5_000, 20_000),
            list_samples=3,
            tick_queues=(10, 20),
            tick_daemons_per_queue=5,
            claim_kind_seconds=0.2,
            insight_sizes=(10_000, 100_000),
            insight_hour_rows=500,
            insight_day_rows=5_000,
            insight_samples=3,
        )

    def fleet_processes(self, daemons: int) -> int:
        return max(1, -(-daemons // self.fleet_per_process))


@dataclass
class Row:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    runs: dict[str, Callable[[], float | None]]  # None: no figure this round
    variant: str = ""  # what tells it from its sibling rows (targets name it)
    # A row whose procrastinate figure is another row's (the same worker run, measured
    # once): that row's key.
    procrastinate_from: str | None = None
    # Why a target on this row may be missed, from the run's own figures ("" if unknown).
    why: Callable[[], str] | None = None
    # Lakeshore's figure over its own floor measured in the same run (the median of the
    # rounds' ratios; None if not measured), for the targets that bound it.
    floor: Callable[[], float | None] | None = None


@dataclass
class Section:
    title: str
    rows: list[Row]
    prepare: Callable[[], object] | None = None
    finish: Callable[[], object] | None = None
    notes: list[str | Callable[[], str]] = field(default_factory=list)  # callables: at the end
    key: str = ""  # what BENCH_ONLY names it by (see __main__)


# ---------------------------------------------------------------------------- helpers


def throughput(steps: list[Callable[[], int]], seconds: float) -> float:
    """Run each step in a thread of its own, again and again, for `seconds`; a step
    returns how many jobs it did (0: nothing left). Jobs per second, all threads."""
    counts = [0] * len(steps)
    started = time.perf_counter()
    deadline = started + seconds

    def work(i: int) -> None:
        while time.perf_counter() < deadline:
            done = steps[i]()
            if not done:
                return
            counts[i] += done

    run_threads([lambda i=i: work(i) for i in range(len(steps))])
    return sum(counts) / (time.perf_counter() - started)


def run_threads(works: list[Callable[[], object]]) -> None:
    """Each callable in a thread of its own, all at once; returns once every one has
    ended, raising the first exception any of them raised."""
    failures: list[BaseException] = []

    def run(work: Callable[[], object]) -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - raised again below, in the caller
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(work,)) for work in works]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def median_ms(call: Callable[[], object], samples: int, seconds: float = 2.0) -> float:
    """The median of `samples` calls, or of those made in `seconds` (3 at least), in ms."""
    call()  # warm: connection, caches
    took: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(took) < samples and (len(took) < 3 or time.perf_counter() < deadline):
        started = time.perf_counter()
        call()
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


def wait_until(done: Callable[[], bool], seconds: float, every: float = 0.05) -> None:
    """Poll `done` until it holds or `seconds` pass."""
    deadline = time.perf_counter() + seconds
    while not done() and time.perf_counter() < deadline:
        time.sleep(every)


def outcomes(claimed: list[dict]) -> list[dict]:
    return [
        {"invocation": int(job["id"]), "attempt": job["attempts"], "state": "succeeded"}
        for job in claimed
    ]


RAW_CLAIM = """
UPDATE jobs SET state = 'running', attempts = attempts + 1
 WHERE id = ANY(ARRAY(SELECT id FROM jobs WHERE queue = %s AND state = 'queued'
                       ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED))
RETURNING id"""
RAW_FINISH = "UPDATE jobs SET state = 'succeeded', finished_at = now() WHERE id = ANY(%s)"
