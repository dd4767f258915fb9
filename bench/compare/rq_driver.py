"""RQ's side of the comparison, driven from the bench's own process: RQ (the project's
.venv, requirements.txt; a bench peer only, never used by the product) on the bench's
Redis (infra.Redis), database 2, the no-op job of rq_job.py.

    submit_one   Queue.enqueue, one call at a time
    batch        Queue.enqueue_many of `size` jobs (one pipeline)
    e2e          `rq worker` processes, RQ's default worker, which forks a work horse
                 per job (as `lakeshore daemon run --isolation process` starts a
                 process per job): one for concurrency 1, as many as the concurrency
                 otherwise; the jobs enqueued at once with enqueue_many, timed to the
                 last success as RQ records it (its finished-job registry, counted every
                 50 ms, as the Lakeshore rows count theirs)

RQ runs as it comes (its defaults: a result kept 500 s, the worker logging at INFO to
its log file): it has no throughput settings to tune."""

import itertools
import time
from pathlib import Path

import redis
import rq
from rq import Queue, Worker

from bench.compare.infra import BIN, RUN_DIR, Redis, start_group, stop_group
from bench.compare.rq_job import noop

DB = 2
QUEUE = "bench"


class RQPeer:
    name = "RQ"

    def __init__(self, redis_server: Redis, logs: Path = RUN_DIR / "log"):
        self.redis = redis_server
        self.logs = logs  # the workers' output, a file a worker
        self.version = rq.__version__
        self.connection: redis.Redis | None = None
        self.queue: Queue | None = None
        self.runs = itertools.count(1)  # a worker's name is its run's and its own

    def setup(self) -> None:
        self.connection = redis.Redis.from_url(self.redis.url(DB))
        self.queue = Queue(QUEUE, connection=self.connection)
        self.reset()

    def reset(self) -> None:
        self.connection.flushdb()

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()

    # ------------------------------------------------------------------ submit

    def submit_one(self, seconds: float) -> float:
        """enqueue, one at a time, for `seconds`; jobs/s."""
        self.reset()
        self.queue.enqueue(noop, 0)  # warm: the connection
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            self.queue.enqueue(noop, count)
            count += 1
        took = time.perf_counter() - started
        self.reset()
        return count / took

    def batch(self, size: int, seconds: float) -> float:
        """enqueue_many of `size` jobs: at least once, then more until `seconds` pass;
        jobs/s."""
        self.reset()
        self.queue.enqueue(noop, 0)  # warm
        counter = itertools.count()
        count, started = 0, time.perf_counter()
        while not count or time.perf_counter() - started < seconds:
            self.queue.enqueue_many(
                [Queue.prepare_data(noop, args=(next(counter),)) for _ in range(size)]
            )
            count += size
        took = time.perf_counter() - started
        self.reset()
        return count / took

    # ------------------------------------------------------------------ end to end

    def e2e(self, concurrency: int, jobs: int, seconds: float) -> float:
        """`concurrency` workers (each forking a work horse per job) started and
        registered, then `jobs` no-op jobs enqueued at once, counted done until all are
        or `seconds` pass; jobs/s. Every worker and work horse is killed at the end,
        whatever happened."""
        self.reset()
        url = self.redis.url(DB)
        run = next(self.runs)
        workers = []
        try:
            for i in range(concurrency):
                log = self.logs / f"rq-c{concurrency}-{i}.log"  # the last run's
                command = [str(BIN / "rq"), "worker", "--url", url, QUEUE]
                command += ["--name", f"rq-{run}-c{concurrency}-{i}"]
                workers.append(start_group(command, env={}, log=log))
            deadline = time.monotonic() + 60
            while Worker.count(connection=self.connection) < concurrency:
                if any(worker.poll() is not None for worker in workers):
                    raise RuntimeError(f"an RQ worker exited; see {self.logs}/rq-c*.log")
                if time.monotonic() > deadline:
                    raise RuntimeError("the RQ workers did not register within 60 s")
                time.sleep(0.05)
            registry = self.queue.finished_job_registry
            started = time.perf_counter()
            self.queue.enqueue_many([Queue.prepare_data(noop, args=(i,)) for i in range(jobs)])
            done = 0
            while done < jobs and time.perf_counter() - started < seconds:
                time.sleep(0.05)  # as the Lakeshore side polls
                done = registry.get_job_count(cleanup=False)
            took = time.perf_counter() - started
            failed = self.queue.failed_job_registry.get_job_count(cleanup=False)
            if failed:
                raise RuntimeError(f"{failed} RQ jobs failed; see {self.logs}/rq-c*.log")
        finally:
            for worker in workers:
                stop_group(worker)
        self.reset()
        return done / took

    def notes(self) -> str:
        return (
            f"RQ {self.version} on the same Redis (database 2), a no-op job "
            "(bench/compare/rq_job.py), RQ's default worker (`rq worker`, a work horse "
            "forked per job, as --isolation process starts a process per job): one worker "
            "at concurrency 1, 8 at concurrency 8; timed from enqueue_many (the jobs "
            "enqueued at once, one pipeline) to the last job in its finished-job registry, "
            "counted every 50 ms; RQ's defaults otherwise (it has no throughput settings): "
            "results kept 500 s, each worker logging its jobs at INFO to its log file"
        )
