"""Celery's side of the comparison, driven from the bench's own process: Celery 5 (the
project's .venv, requirements.txt) on the bench's Redis (infra.Redis), the no-op task of
celery_app.py. The broker is Redis database 0, the result backend database 1.

    submit_one   apply_async, one call at a time
    batch        a group of `size` signatures, sent with one apply_async
    e2e          a worker (`celery worker`, the prefork pool, the row's concurrency) in
                 each configuration, in turn: a group of the jobs sent at once, timed to
                 the last success as the worker stored it (the result backend's database,
                 counted with DBSIZE every 50 ms, as the Lakeshore rows count theirs)

The submit rows send from an app with no result backend: nothing waits for a result
there (and no worker runs). The configurations of the end-to-end rows:

    plain   Celery's defaults with the row's concurrency: one app with the result
            backend on both sides (so the sender subscribes to each task's result, as
            Celery does when an app has a Redis backend), early acknowledgement, a
            prefetch multiplier of 4
    tuned   as Celery's documentation advises for many short tasks: task_acks_late
            (at-least-once, what Lakeshore promises), worker_prefetch_multiplier 64, rate
            limits off (celery_app.TUNED); the worker without gossip, mingle and
            heartbeat (no broker traffic of its own); the sender with no result backend
            (it never waits on a result; the worker still stores every one)

The faster of the two is the row's figure in each round; both are kept for the notes."""

import itertools
import time
from pathlib import Path

import celery
import redis
from celery import Celery, group

from bench.compare import celery_app
from bench.compare.infra import BIN, RUN_DIR, Redis, start_group, stop_group

BROKER_DB, RESULTS_DB = 0, 1
CONFIGS = ("plain", "tuned")
TUNED_FLAGS = ["--without-gossip", "--without-mingle", "--without-heartbeat"]


class CeleryPeer:
    name = "Celery"

    def __init__(self, redis_server: Redis, logs: Path = RUN_DIR / "log"):
        self.redis = redis_server
        self.logs = logs  # the workers' output, a file a worker
        self.version = celery.__version__
        self.broker: redis.Redis | None = None
        self.results: redis.Redis | None = None
        self.sender: Celery | None = None  # the submit rows': no result backend
        # end to end, per concurrency: each configuration's figures, round by round
        self.configs: dict[int, dict[str, list[float]]] = {}
        self.sends: list[float] = []  # s: each end-to-end run's group, sent

    def setup(self) -> None:
        self.broker = redis.Redis.from_url(self.redis.url(BROKER_DB))
        self.results = redis.Redis.from_url(self.redis.url(RESULTS_DB))
        self.sender = celery_app.make_app(self.redis.kombu_url(BROKER_DB), None)
        self.reset()

    def reset(self) -> None:
        self.broker.flushdb()
        self.results.flushdb()

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
        for client in (self.broker, self.results):
            if client is not None:
                client.close()

    # ------------------------------------------------------------------ submit

    def submit_one(self, seconds: float) -> float:
        """apply_async, one at a time, for `seconds`; jobs/s."""
        self.reset()
        task = self.sender.tasks[celery_app.TASK]
        task.apply_async(args=(0,))  # warm: the broker connection
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            task.apply_async(args=(count,))
            count += 1
        took = time.perf_counter() - started
        self.reset()
        return count / took

    def batch(self, size: int, seconds: float) -> float:
        """Groups of `size` sent with one apply_async each: at least one, then more
        until `seconds` pass; jobs/s."""
        self.reset()
        task = self.sender.tasks[celery_app.TASK]
        task.apply_async(args=(0,))  # warm
        counter = itertools.count()
        count, started = 0, time.perf_counter()
        while not count or time.perf_counter() - started < seconds:
            group(task.s(next(counter)) for _ in range(size)).apply_async()
            count += size
        took = time.perf_counter() - started
        self.reset()
        return count / took

    # ------------------------------------------------------------------ end to end

    def e2e(self, concurrency: int, jobs: int, seconds: float) -> float:
        """Both configurations, in turn (the first alternates round by round); the
        faster one's jobs/s. Each figure is kept for the notes."""
        kept = self.configs.setdefault(concurrency, {name: [] for name in CONFIGS})
        order = list(CONFIGS) if len(kept["tuned"]) % 2 == 0 else list(CONFIGS)[::-1]
        for config in order:
            kept[config].append(self.worker_run(config, concurrency, jobs, seconds))
        return max(kept[config][-1] for config in CONFIGS)

    def worker_command(self, config: str, concurrency: int) -> list[str]:
        command = [str(BIN / "celery"), "-A", "bench.compare.celery_app", "worker"]
        command += ["--pool", "prefork", "--concurrency", str(concurrency)]
        command += ["--hostname", f"bench-{config}@%h"]
        return command + (TUNED_FLAGS if config == "tuned" else [])

    def worker_run(self, config: str, concurrency: int, jobs: int, seconds: float) -> float:
        """Start a worker in `config`, send `jobs` no-op tasks as one group, count the
        stored results until all are there or `seconds` pass; jobs/s. The worker and
        its pool are killed at the end, whatever happened."""
        self.reset()
        ready = self.redis.folder / f"celery-{config}-c{concurrency}.ready"
        ready.unlink(missing_ok=True)
        env = {
            "BENCH_CELERY_BROKER": self.redis.kombu_url(BROKER_DB),
            "BENCH_CELERY_BACKEND": self.redis.kombu_url(RESULTS_DB),
            "BENCH_CELERY_CONFIG": config,
            "BENCH_CELERY_READY": str(ready),
        }
        log = self.logs / f"celery-{config}-c{concurrency}.log"
        backend = self.redis.kombu_url(RESULTS_DB) if config == "plain" else None
        sender = celery_app.make_app(self.redis.kombu_url(BROKER_DB), backend, config)
        worker = start_group(self.worker_command(config, concurrency), env=env, log=log)
        try:
            deadline = time.monotonic() + 60
            while not ready.exists():
                if worker.poll() is not None:
                    raise RuntimeError(f"the Celery worker exited; see {log}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Celery worker was not ready within 60 s; see {log}")
                time.sleep(0.05)
            task = sender.tasks[celery_app.TASK]
            started = time.perf_counter()
            group(task.s(i) for i in range(jobs)).apply_async()
            self.sends.append(time.perf_counter() - started)
            done = 0
            while done < jobs and time.perf_counter() - started < seconds:
                time.sleep(0.05)  # as the Lakeshore side polls
                done = self.results.dbsize()
            took = time.perf_counter() - started
        finally:
            stop_group(worker)
            sender.close()
            ready.unlink(missing_ok=True)
        self.reset()
        return done / took

    def notes(self) -> str:
        """Both configurations' figures, and which one the table shows."""
        if not self.configs:
            return "Celery not measured end to end"
        parts = []
        for concurrency, kept in sorted(self.configs.items()):
            plain, tuned = kept["plain"], kept["tuned"]
            faster = sum(t > p for t, p in zip(tuned, plain, strict=False))  # a run may fail
            parts.append(
                f"concurrency {concurrency}: plain "
                + ", ".join(f"{v:,.0f}" for v in plain)
                + " jobs/s; tuned "
                + ", ".join(f"{v:,.0f}" for v in tuned)
                + f" jobs/s; tuned was the faster in {faster} of {len(tuned)} round(s)"
            )
        return (
            f"Celery {self.version} on Redis (Debian's redis-server, started by the bench on "
            "a unix socket, no persistence; broker database 0, results database 1), a no-op "
            "task (bench/compare/celery_app.py), `celery worker --pool prefork "
            "--concurrency` the row's concurrency; timed from the group's apply_async (the "
            "jobs sent at once) to the last result stored, counted every 50 ms. Its column "
            "is the faster of two configurations in each round: plain (Celery's defaults: "
            "early acknowledgement, prefetch multiplier 4, the sender's app with the result "
            "backend, so it subscribes to each result) and tuned as Celery's documentation "
            "advises for many short tasks (task_acks_late = True, because Lakeshore promises "
            "at-least-once and so must the peer; worker_prefetch_multiplier = 64; rate "
            "limits off; --without-gossip --without-mingle --without-heartbeat; the sender "
            "with no result backend, the worker storing every result); "
            + "; ".join(parts)
            + (
                f"; sending the group (one message a task) took {min(self.sends):.2f}–"
                f"{max(self.sends):.2f} s of a run"
                if self.sends
                else ""
            )
        )
