"""procrastinate's side of the comparison. Runs in var/bench-venv (not the project's
.venv), from the checkout's root: `python -m bench.compare.procrastinate_driver URL`,
then JSON lines (lines.py). Standard library and procrastinate only.

    {"cmd": "setup"}                                   apply procrastinate's schema
    {"cmd": "defer_one", "seconds": 3}                 task.defer(), one at a time
    {"cmd": "batch_defer", "size": 1000, "seconds": 3} task.batch_defer(*size kwargs)
    {"cmd": "worker", "concurrency": 8, "jobs": 1000, "seconds": 10}
        start the worker, batch-defer `jobs` no-op jobs, count them done
    {"cmd": "worker_expert", "concurrency": 8, "processes": 2, "jobs": 1000, "seconds": 10}
        the same, as an expert runs procrastinate: `processes` worker processes (one a
        core) sharing the concurrency, an `async def` task, and each process's
        connection pool opened at its full size up front (PsycopgConnector's min_size =
        max_size = its concurrency + 2: the listener, and a spare)
    {"cmd": "reset"}                                   empty the jobs table

Answers carry {"count": n, "seconds": s}: n jobs deferred, or done, in s seconds."""

import asyncio
import contextlib
import subprocess
import sys
import time

import procrastinate

from bench.compare.lines import serve

POOL = {"min_size": 1, "max_size": 10}  # room for a worker of concurrency 8 + its listener


def make_app(url: str) -> tuple[procrastinate.App, procrastinate.tasks.Task]:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url, **POOL))

    @app.task(name="noop")
    def noop(i: int) -> None:
        return None

    return app, noop


def make_expert_app(url: str, concurrency: int) -> procrastinate.App:
    size = concurrency + 2
    connector = procrastinate.PsycopgConnector(conninfo=url, min_size=size, max_size=size)
    app = procrastinate.App(connector=connector)

    @app.task(name="noop")
    async def noop(i: int) -> None:
        return None

    return app


async def expert_worker(url: str, concurrency: int) -> None:
    """One process of worker_expert: says `ready` once its worker listens, then works
    until it is killed."""
    app = make_expert_app(url, concurrency)
    async with app.open_async():
        running = asyncio.create_task(
            app.run_worker_async(concurrency=concurrency, wait=True, install_signal_handlers=False)
        )
        await asyncio.sleep(0.5)  # let it start and LISTEN, as `worker` does
        print("ready", flush=True)
        await running


class Driver:
    def __init__(self, url: str):
        self.url = url
        self.app, self.noop = make_app(url)  # the synchronous side: defer, batch_defer
        self.app.open()

    def setup(self) -> None:
        self.app.schema_manager.apply_schema()

    def reset(self) -> None:
        self.app.connector.get_sync_connector().execute_query(
            "TRUNCATE procrastinate_jobs RESTART IDENTITY CASCADE"
        )

    def defer_one(self, seconds: float) -> dict:
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            self.noop.defer(i=count)
            count += 1
        return {"count": count, "seconds": time.perf_counter() - started}

    def batch_defer(self, size: int, seconds: float) -> dict:
        """At least one batch, then more until `seconds` pass."""
        count, started = 0, time.perf_counter()
        while not count or time.perf_counter() - started < seconds:
            self.noop.batch_defer(*({"i": count + k} for k in range(size)))
            count += size
        return {"count": count, "seconds": time.perf_counter() - started}

    def worker(self, concurrency: int, jobs: int, seconds: float) -> dict:
        return asyncio.run(self._worker(concurrency, jobs, seconds))

    async def _worker(self, concurrency: int, jobs: int, seconds: float) -> dict:
        app, noop = make_app(self.url)
        async with app.open_async():
            running = asyncio.create_task(
                app.run_worker_async(
                    concurrency=concurrency, wait=True, install_signal_handlers=False
                )
            )
            await asyncio.sleep(0.5)  # let it start and LISTEN
            started = time.perf_counter()
            await noop.batch_defer_async(*({"i": i} for i in range(jobs)))
            done = 0
            while done < jobs and time.perf_counter() - started < seconds:
                await asyncio.sleep(0.05)  # as the Lakeshore side polls
                row = await app.connector.execute_query_one_async(
                    "SELECT count(*) AS n FROM procrastinate_jobs WHERE status = 'succeeded'"
                )
                done = row["n"]
            took = time.perf_counter() - started
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
        return {"count": done, "seconds": took}

    def worker_expert(self, concurrency: int, processes: int, jobs: int, seconds: float) -> dict:
        processes = max(1, min(processes, concurrency))
        share = concurrency // processes
        workers = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.compare.procrastinate_driver", self.url, str(share)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(processes)
        ]
        try:
            for worker in workers:
                if worker.stdout.readline().strip() != "ready":
                    raise RuntimeError("an expert worker process did not start")
            query = "SELECT count(*) AS n FROM procrastinate_jobs WHERE status = 'succeeded'"
            sync = self.app.connector.get_sync_connector()
            started = time.perf_counter()
            self.noop.batch_defer(*({"i": i} for i in range(jobs)))
            done = 0
            while done < jobs and time.perf_counter() - started < seconds:
                time.sleep(0.05)  # as the Lakeshore side polls
                done = sync.execute_query_one(query)["n"]
            took = time.perf_counter() - started
        finally:
            for worker in workers:
                worker.kill()
                worker.wait()
        return {"count": done, "seconds": took, "processes": processes, "each": share}

    def close(self) -> None:
        self.app.close()


def main() -> None:
    if len(sys.argv) > 2:  # one process of worker_expert: URL CONCURRENCY
        asyncio.run(expert_worker(sys.argv[1], int(sys.argv[2])))
        return
    driver = Driver(sys.argv[1])
    try:
        serve(driver)
    finally:
        driver.close()


if __name__ == "__main__":
    main()
