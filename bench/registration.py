"""How fast daemons register: a fleet coming up sends every daemon's registration with
one bootstrap token at once. N registrations (BENCH_REGISTRATIONS, 1000), at most C at
once (BENCH_REGISTRATIONS_AT_ONCE, 64), against `make bench`'s own server (gunicorn as
`make run` serves, its own PostgreSQL under var/pg-bench), in three rounds; each round
prints registrations a second, the answer's p50 and p99, and the server's CPU per
registration (its processes' CPU time; the database's is not counted). Prints
figures, asserts nothing. Run with `.venv/bin/python -m bench.registration`."""

import asyncio
import os
import time

import httpx
import psutil

from bench.compare.infra import Postgres
from bench.compare.systems import Lakeshore

COUNT = int(os.environ.get("BENCH_REGISTRATIONS", "1000"))
AT_ONCE = int(os.environ.get("BENCH_REGISTRATIONS_AT_ONCE", "64"))
ROUNDS = 3


def server_cpu(pid: int) -> float:
    """CPU seconds of the server's processes (the gunicorn master and its workers)."""
    total = 0.0
    master = psutil.Process(pid)
    for process in (master, *master.children(recursive=True)):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:  # a worker being replaced
            continue
        total += times.user + times.system
    return total


async def register_all(lakeshore: Lakeshore, tag: str) -> tuple[float, list[float]]:
    """COUNT registrations, AT_ONCE at a time: (seconds they took, each one's seconds)."""
    taken: list[float] = []
    room = asyncio.Semaphore(AT_ONCE)
    limits = httpx.Limits(max_connections=AT_ONCE)
    async with lakeshore.async_client("daemon", limits=limits) as client:

        async def one(index: int) -> None:
            async with room:
                started = time.perf_counter()
                answer = await client.post(
                    "/api/v1/daemons/register/",
                    json={"name": f"reg-{tag}-{index}", "queues": ["idle"]},
                )
                answer.raise_for_status()
                taken.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(one(index) for index in range(COUNT)))
        return time.perf_counter() - started, taken


def main() -> None:
    pg = Postgres()
    pg.start()
    lakeshore = Lakeshore(pg)
    try:
        lakeshore.setup()
        assert lakeshore.server is not None
        print(f"{COUNT} registrations with one bootstrap token, at most {AT_ONCE} at once")
        for turn in range(ROUNDS):
            before = server_cpu(lakeshore.server.pid)
            seconds, taken = asyncio.run(register_all(lakeshore, f"{time.time_ns()}"))
            cpu = server_cpu(lakeshore.server.pid) - before
            taken.sort()
            print(
                f"round {turn + 1}: {COUNT / seconds:.0f} registrations/s, "
                f"p50 {taken[len(taken) // 2] * 1000:.0f} ms, "
                f"p99 {taken[int(len(taken) * 0.99)] * 1000:.0f} ms, "
                f"server CPU {cpu / COUNT * 1000:.2f} ms each",
                flush=True,
            )
    finally:
        lakeshore.close()
        pg.stop()


if __name__ == "__main__":
    main()
