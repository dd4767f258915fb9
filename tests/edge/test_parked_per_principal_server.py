"""Issue 29, "Parked waits have no per-principal limit", performed against `make run`'s
server (gunicorn's uvicorn worker; one process, so that its bounds are the whole
server's) with room for 20 parked waits (LAKESHORE_MAX_PARKED) and a share of 5 per
principal (LAKESHORE_MAX_PARKED_PER_PRINCIPAL). Daemon A's credential sends 21 claims
that would each wait 30 s: 5 park, the other 16 answer at once, empty, with
Retry-After, as past the whole bound. Daemon B's claim still parks: it waits its
second and answers with no Retry-After.

The negative control raises the share to the whole bound: 20 of A's claims take every
room (the 21st is refused), and B's claim gets Retry-After (jobs/waits.py)."""

import asyncio
import time

import httpx
import pytest

from tests.support import builders
from tests.support.servers import environment, gunicorn

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.security]

ROOM = 20  # LAKESHORE_MAX_PARKED
SHARE = 5  # LAKESHORE_MAX_PARKED_PER_PRINCIPAL
WAIT = 30.0  # what A's claims ask: they outlive every check below


def _server(tmp_path, share: int):
    env = environment(
        tmp_path,
        LAKESHORE_WEB_WORKERS="1",
        LAKESHORE_MAX_PARKED=str(ROOM),
        LAKESHORE_MAX_PARKED_PER_PRINCIPAL=str(share),
        LAKESHORE_DB_POOL_MAX="12",
    )
    return gunicorn(tmp_path, env)


def _daemon(base: str, bootstrap: str, name: str) -> tuple[int, str]:
    """A daemon registered through the server: (its id, its own credential)."""
    made = httpx.post(
        f"{base}/api/v1/daemons/register/",
        json={"name": name, "queues": ["idle"]},
        headers={"Authorization": f"Bearer {bootstrap}"},
    )
    assert made.status_code == 201, made.text
    return made.json()["id"], made.json()["token"]


async def _claim(client: httpx.AsyncClient, daemon: tuple[int, str], wait: float):
    pk, token = daemon
    return await client.post(
        f"/api/v1/daemons/{pk}/claim/",
        json={"limit": 1, "wait": wait},
        headers={"Authorization": f"Bearer {token}"},
    )


async def _fill_then_claim(base: str, a, b, *, share: int) -> dict:
    """A sends ROOM + 1 claims. Those past A's share, or past the room, answer at once:
    once they have, the server holds the rest parked (min(share, ROOM) of them: a
    refusal is decided only when a share or the room is full), and B claims once."""
    limits = httpx.Limits(max_connections=ROOM + 10, max_keepalive_connections=0)
    seen = {}
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=WAIT + 30) as client:
        filling = [asyncio.create_task(_claim(client, a, WAIT)) for _ in range(ROOM + 1)]
        refused = ROOM + 1 - min(share, ROOM)
        deadline = time.monotonic() + 20
        while sum(task.done() for task in filling) < refused and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        seen["a_answered"] = [task.result() for task in filling if task.done()]
        seen["b"] = await _claim(client, b, 1.0)
        seen["a_still_waiting"] = sum(not task.done() for task in filling)
        for task in filling:
            task.cancel()
        await asyncio.gather(*filling, return_exceptions=True)
    return seen


def _run(tmp_path, share: int) -> dict:
    builders.queue(name="idle")
    bootstrap = builders.token("daemon")
    with _server(tmp_path, share) as (base, _):
        a = _daemon(base, bootstrap, "a")
        b = _daemon(base, bootstrap, "b")
        return builders.run_async(_fill_then_claim(base, a, b, share=share))


def _refused_at_once(answers: list[httpx.Response]) -> bool:
    return all(
        r.status_code == 200 and r.json() == [] and r.headers.get("Retry-After") == str(int(WAIT))
        for r in answers
    )


def test_one_daemons_claims_take_only_its_share_and_another_daemon_still_parks(tmp_path):
    seen = _run(tmp_path, SHARE)
    assert len(seen["a_answered"]) == ROOM + 1 - SHARE
    assert _refused_at_once(seen["a_answered"])
    b = seen["b"]
    assert b.status_code == 200 and b.json() == []
    assert "Retry-After" not in b.headers, "B was refused: A's claims took its room"
    assert seen["a_still_waiting"] == SHARE


def test_control_with_the_share_raised_to_the_whole_room_the_other_daemon_is_refused(
    tmp_path,
):
    seen = _run(tmp_path, ROOM)
    assert len(seen["a_answered"]) == 1  # the one past the room
    assert _refused_at_once(seen["a_answered"])
    b = seen["b"]
    assert b.status_code == 200 and b.json() == []
    assert b.headers.get("Retry-After") == "1"
    assert seen["a_still_waiting"] == ROOM
