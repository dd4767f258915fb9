"""Many SDK awaits, result streams and log follows wait on one server at once (issue 21):
under `make run`'s server (gunicorn's uvicorn workers, edge/streams.py)
each is parked on the event loop between its looks, holding no thread. All of them wait
their whole time at once, none is refused, a frame written meanwhile reaches its stream,
and the server's threads stay a small fixed number (counted from /proc). That the frame
wakes its stream, rather than the stream's next look finding it, is shown in process
(tests/edge/test_asgi_streams.py), where the looks can be pushed out of the way; here
how soon it arrives is printed.

The negative control sends the same requests to the threaded WSGI server (gunicorn's
gthread worker): there each holds a thread while it waits, so past LAKESHORE_MAX_WAITS
a process answers an await at once (its current state) and refuses a stream with 503
`busy`."""

import asyncio
import time

import httpx
import msgpack
import psutil
import pytest
from django.db import connection

from jobs import sdk_frames, services
from jobs.models import Invocation
from tests.edge.test_parked_long_polls import WORKERS, _environment, _threads
from tests.support import builders
from tests.support.servers import gunicorn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("load"),  # one at a time: each loads both cores
]

EACH = 80  # awaits, and as many streams; half as many follows
# Seconds each waits (a stream: its silence): long enough that "answered at once" (the
# control's refusals, up to 2 s in CI's make test) and "waited its whole time" (here)
# are far apart.
WAIT = 10.0
THREADS = 8  # LAKESHORE_WEB_THREADS: 4 waits a process on the threaded server
P = "/v1/namespaces/default/producer"
MSGPACK = {"Content-Type": "application/x-msgpack"}  # what the SDK sends, a GET too
CLI = {"Accept": "application/json"}


def _server_environment(tmp_path) -> dict:
    return {
        **_environment(tmp_path),
        "LAKESHORE_WEB_THREADS": str(THREADS),
        "LAKESHORE_SDK_STREAM_IDLE_SECONDS": str(WAIT),
    }


async def _requests(base: str, token: str, ids: list[int], server: psutil.Process) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    many = 3 * EACH
    limits = httpx.Limits(max_connections=many, max_keepalive_connections=many)
    seen = {"frame": None}
    async with httpx.AsyncClient(
        base_url=base, limits=limits, timeout=WAIT + 30, headers=headers
    ) as client:

        async def awaited(pk: int):
            started = time.monotonic()
            body = msgpack.packb({"invocation_id": str(pk), "timeout_s": WAIT})
            response = await client.post(f"{P}/await", content=body, headers=MSGPACK)
            return response, time.monotonic() - started

        async def streamed(pk: int):
            started = time.monotonic()
            path = f"{P}/invocations/{pk}/result/stream"
            async with client.stream("GET", path, headers=MSGPACK) as response:
                body = b""
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if seen["frame"] is None and chunk:
                        seen["frame"] = time.monotonic()
            return response, time.monotonic() - started, body

        async def followed(pk: int):
            started = time.monotonic()
            path = f"/api/v1/jobs/{pk}/logs/"
            params = {"follow": 1, "wait": WAIT}  # as `lakeshore jobs logs --follow` asks
            response = await client.get(path, params=params, headers=CLI)
            return response, time.monotonic() - started

        awaits = [asyncio.create_task(awaited(pk)) for pk in ids]
        streams = [asyncio.create_task(streamed(pk)) for pk in ids]
        follows = [asyncio.create_task(followed(pk)) for pk in ids[: EACH // 2]]
        await asyncio.sleep(WAIT / 2)  # every one is waiting by now
        seen["threads"] = _threads(server)
        written = time.monotonic()
        await asyncio.to_thread(_final_frame, ids[-1])  # a job no follow reads
        seen["awaits"] = await asyncio.gather(*awaits)
        seen["streams"] = await asyncio.gather(*streams)
        seen["follows"] = await asyncio.gather(*follows)
    seen["frame_after"] = seen["frame"] - written if seen["frame"] else None
    seen["cpu"] = _cpu(server)
    return seen


def _final_frame(pk: int) -> None:
    try:
        # a frame of the first attempt, as its worker writes it (the job stays pending for
        # the awaits); the stream then waits for more (an attempt's final frame ends it
        # only once the invocation has ended)
        Invocation.objects.filter(pk=pk).update(attempts=1)
        sdk_frames.insert_frame(str(pk), 0, msgpack.packb([2, 0, "done", None]), False, attempt=1)
    finally:
        connection.close()


def _cpu(server: psutil.Process) -> float:
    """CPU seconds the server's worker processes used so far."""
    return sum(sum(child.cpu_times()[:2]) for child in server.children(recursive=True))


def _run(base: str, server: psutil.Process) -> dict:
    builders.queue(name="idle")
    ids = [
        services.invocation_submit(function="f", queue="idle", wire="value", args_blob=b"x")[0].pk
        for _ in range(EACH)
    ]
    token = builders.token("operator")
    connection.close()
    before, started = _cpu(server), time.monotonic()
    seen = builders.run_async(_requests(base, token, ids, server))
    seen["cpu"] -= before
    seen["elapsed"] = time.monotonic() - started
    return seen


def test_many_awaits_streams_and_follows_wait_at_once_holding_no_thread(tmp_path):
    with gunicorn(tmp_path, _server_environment(tmp_path)) as (base, proc):
        seen = _run(base, psutil.Process(proc.pid))
    awaits, streams, follows = seen["awaits"], seen["streams"], seen["follows"]
    assert all(r.status_code == 200 for r, _ in awaits)
    assert {msgpack.unpackb(r.content)["state"] for r, _ in awaits} == {"pending"}
    # each waited its whole time, all at once (in turns through 2 × 4 waits, 10 rounds
    # of WAIT); a generous upper bound: 2 cores also run the clients
    assert min(took for _, took in awaits) >= WAIT - 0.5
    assert max(took for _, took in awaits) < 3 * WAIT
    assert all(r.status_code == 200 for r, _, _ in streams)
    *quiet, done = streams
    assert msgpack.unpackb(done[2]) == [2, 0, "done", None]
    assert seen["frame_after"] is not None  # it came while the stream was open
    assert all(body == b"" and took >= WAIT - 0.5 for _, took, body in quiet)
    assert all(r.status_code == 200 and r.json()["lines"] == [] for r, _ in follows)
    assert min(took for _, took in follows) >= WAIT - 0.5
    # the threads: each process's two bounded pools, its listener and the server's own
    assert seen["threads"] <= WORKERS * (2 * THREADS + 10), seen["threads"]
    print(
        f"server CPU, {EACH * 5 // 2} requests waiting: {seen['cpu'] / seen['elapsed']:.2f} cores; "
        f"the frame reached its stream {seen['frame_after']:.3f} s after it was written"
    )


def test_control_a_threaded_server_answers_the_waits_past_its_threads_at_once(tmp_path):
    with gunicorn(
        tmp_path, _server_environment(tmp_path), app="lakeshore_admin.wsgi:application"
    ) as (base, proc):
        seen = _run(base, psutil.Process(proc.pid))
    # refused a slot: answered at once (the SDK asks again), before the WAIT that every
    # await on the parked server waits (at least WAIT - 0.5 there); "at once" is within
    # half of it here, as the 16 threads work through 200 requests on a loaded machine
    # (in CI's make test the refusals took up to 2 s)
    early = [took for r, took in seen["awaits"] if took < WAIT / 2]
    assert len(early) > EACH / 2
    busy = [r for r, _, _ in seen["streams"] if r.status_code == 503]
    assert len(busy) > EACH / 2
