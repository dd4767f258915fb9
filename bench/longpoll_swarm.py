"""bench/longpoll.py's daemons, in a process of their own (no Django here): each
long-polls as `lakeshore daemon run` does when idle (claim with `wait` back to back; on
Retry-After, wait that long plus up to as long again at random) and heartbeats every
10 s on a connection of its own.

    python -m bench.longpoll_swarm < {"base", "daemons": [[id, token]…], "seconds", "wait"}

prints its counts as JSON."""

import asyncio
import json
import random
import resource
import sys
import time

import httpx

TIMEOUT = 30.0  # seconds a client waits for any answer
HEARTBEAT_EVERY = 10.0  # lakeshore daemon run's default


async def swarm(base: str, daemons: list, seconds: float, wait: float) -> dict:
    counts = {"claims": 0, "refused": 0, "lost": 0, "errors": 0, "heartbeats": []}
    limits = httpx.Limits(max_connections=4 * len(daemons), max_keepalive_connections=None)
    end = time.monotonic() + seconds

    async def claim_loop(client, daemon: str, token: str):
        headers = {"Authorization": f"Bearer {token}"}
        await asyncio.sleep(random.uniform(0, 2))  # noqa: S311 - they start over 2 s
        while time.monotonic() < end:
            try:
                answer = await client.post(
                    f"/api/v1/daemons/{daemon}/claim/",
                    json={"limit": 1, "wait": wait},
                    headers=headers,
                )
            except httpx.HTTPError:
                counts["errors"] += 1
                continue
            counts["claims"] += 1
            if answer.status_code == 409:  # daemon_lost: the reaper gave up on it
                counts["lost"] += 1
                return
            after = answer.headers.get("Retry-After")
            if after:
                counts["refused"] += 1
                await asyncio.sleep(float(after) * (1 + random.random()))  # noqa: S311

    async def heartbeat_loop(client, daemon: str, token: str):
        headers = {"Authorization": f"Bearer {token}"}
        await asyncio.sleep(random.uniform(0, HEARTBEAT_EVERY))  # noqa: S311
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                await client.post(f"/api/v1/daemons/{daemon}/heartbeat/", json={}, headers=headers)
                counts["heartbeats"].append(time.monotonic() - t0)
            except httpx.HTTPError:
                counts["heartbeats"].append(TIMEOUT)
            await asyncio.sleep(max(0.0, HEARTBEAT_EVERY - (time.monotonic() - t0)))

    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=TIMEOUT) as client:
        tasks = [claim_loop(client, d, t) for d, t in daemons]
        tasks += [heartbeat_loop(client, d, t) for d, t in daemons]
        await asyncio.gather(*tasks)
    return counts


def main() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # two sockets a daemon
    args = json.load(sys.stdin)
    counts = asyncio.run(swarm(args["base"], args["daemons"], args["seconds"], args["wait"]))
    json.dump(counts, sys.stdout)


if __name__ == "__main__":
    main()
