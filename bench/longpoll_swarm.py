"""bench/longpoll.py's daemons, in a process of their own (no Django here): each
long-polls as `lakeshore daemon run` does when idle (claim with `wait` back to back; on
Retry-After, wait that long plus up to as long again at random) and heartbeats every
10 s on a connection of its own.

    python -m bench.longpoll_swarm < {"base", "token", "daemons": N, "seconds", "wait"}

Each daemon registers itself (with the bootstrap token; then it acts with its own
credential when the server gives one) at a random moment of the first RAMP seconds,
as a fleet coming up does, and heartbeats at once.

prints its counts as JSON."""

import asyncio
import json
import random
import resource
import ssl
import sys
import time

import httpx

TIMEOUT = 30.0  # seconds a client waits for any answer
HEARTBEAT_EVERY = 10.0  # lakeshore daemon run's default
RAMP = 10.0  # seconds over which the daemons start


async def swarm(base: str, token: str, daemons: int, seconds: float, wait: float) -> dict:
    counts = {"claims": 0, "refused": 0, "lost": 0, "errors": 0, "heartbeats": [], "kinds": {}}

    def failed(exc: Exception) -> None:
        counts["errors"] += 1
        kind = type(exc).__name__
        counts["kinds"][kind] = counts["kinds"].get(kind, 0) + 1

    end = time.monotonic() + seconds
    # One TLS context for every client (the server speaks plain HTTP): httpx would load
    # the CA bundle for each of them, 600 times, about 10 s of a core and 1 MiB each,
    # which is the load generator's cost, not the server's.
    no_tls = ssl.create_default_context()
    no_tls.check_hostname = False
    no_tls.verify_mode = ssl.CERT_NONE

    async def daemon(index: int):
        await asyncio.sleep(random.uniform(0, RAMP))  # noqa: S311 - a fleet coming up
        async with httpx.AsyncClient(
            base_url=base,
            headers={"Authorization": f"Bearer {token}"},
            limits=httpx.Limits(max_connections=2),
            timeout=TIMEOUT,
            verify=no_tls,
        ) as client:
            me = await register(client, index)
            if me.get("token"):  # its own credential (issue 17)
                client.headers["Authorization"] = f"Bearer {me['token']}"
            await asyncio.gather(claim_loop(client, me["id"]), heartbeat_loop(client, me["id"]))

    async def register(client, index: int) -> dict:
        delay = 0.5  # retried with back-off, as lakeshore daemon run does
        while True:
            try:
                answer = await client.post(
                    "/api/v1/daemons/register/",
                    json={"name": f"swarm-{index}", "queues": ["idle"]},
                )
                if answer.status_code == 201:
                    return answer.json()
            except httpx.HTTPError as exc:
                failed(exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def claim_loop(client, daemon: str):
        while time.monotonic() < end:
            try:
                answer = await client.post(
                    f"/api/v1/daemons/{daemon}/claim/", json={"limit": 1, "wait": wait}
                )
            except httpx.HTTPError as exc:
                failed(exc)
                await asyncio.sleep(0.5)  # lakeshore daemon run's first back-off
                continue
            counts["claims"] += 1
            if answer.status_code == 409:  # daemon_lost: the reaper gave up on it
                counts["lost"] += 1
                return
            after = answer.headers.get("Retry-After")
            if after:
                counts["refused"] += 1
                await asyncio.sleep(float(after) * (1 + random.random()))  # noqa: S311

    async def heartbeat_loop(client, daemon: str):
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                await client.post(f"/api/v1/daemons/{daemon}/heartbeat/", json={})
                counts["heartbeats"].append(time.monotonic() - t0)
            except httpx.HTTPError as exc:
                failed(exc)
                counts["heartbeats"].append(TIMEOUT)
            await asyncio.sleep(max(0.0, HEARTBEAT_EVERY - (time.monotonic() - t0)))

    # A client (two connections) a daemon, as each daemon process has its own: one
    # client of 1,200 connections spends its time in its pool's bookkeeping.
    await asyncio.gather(*(daemon(i) for i in range(daemons)))
    return counts


def main() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # two sockets a daemon
    args = json.load(sys.stdin)
    counts = asyncio.run(
        swarm(args["base"], args["token"], args["daemons"], args["seconds"], args["wait"])
    )
    json.dump(counts, sys.stdout)


if __name__ == "__main__":
    main()
