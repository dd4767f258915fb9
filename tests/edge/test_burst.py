"""The production server under a burst: 240 requests at once, half of them 15-second
claim long-polls. No 5xx, /healthz answers 200 throughout, and every request right
after is answered normally. Runs `make run`'s gunicorn configuration against the test
database; prints p50/p99 and requests/s."""

import threading
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection

from tests.support import builders
from tests.support.servers import environment, gunicorn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("load"),  # one at a time: each loads both cores
]

ROOT = Path(__file__).resolve().parents[2]
TOTAL = 240
WAIT = 15.0


@pytest.fixture
def server(tmp_path):
    with gunicorn(tmp_path, environment(tmp_path, LAKESHORE_DB_POOL_MAX="12")) as (base, _):
        yield base


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))] if values else float("nan")


def test_a_burst_of_240_half_long_polls_gives_no_5xx_and_health_stays_200(server):
    builders.queue(name="idle")
    operator = {"Authorization": f"Bearer {builders.token('operator')}"}
    daemon = {"Authorization": f"Bearer {builders.token('daemon')}"}
    connection.close()
    with httpx.Client(base_url=server, headers=daemon, timeout=30) as client:
        registered = [
            client.post("/api/v1/daemons/register/", json={"name": f"b{i}", "queues": ["idle"]})
            .raise_for_status()
            .json()
            for i in range(TOTAL // 2)
        ]
    ids = [r["id"] for r in registered]
    own = [{"Authorization": f"Bearer {r['token']}"} for r in registered]  # each its own

    results: list[tuple[str, int, float]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(TOTAL)

    def request(kind: str, i: int):
        with httpx.Client(
            base_url=server, headers=own[i] if kind == "claim" else operator, timeout=60
        ) as client:
            barrier.wait()
            t0 = time.perf_counter()
            try:
                if kind == "claim":
                    response = client.post(
                        f"/api/v1/daemons/{ids[i]}/claim/", json={"limit": 1, "wait": WAIT}
                    )
                    ok = response.status_code == 200 and response.json() == []
                else:
                    response = client.get("/api/v1/jobs/", params={"limit": 50})
                    ok = response.status_code == 200
                code = response.status_code if ok else -response.status_code
            except httpx.HTTPError:
                code = 599
            with lock:
                results.append((kind, code, time.perf_counter() - t0))

    health: list[int] = []
    burst_over = threading.Event()

    def poll_health():
        with httpx.Client(base_url=server, timeout=10) as client:
            while not burst_over.is_set():
                try:
                    health.append(client.get("/healthz").status_code)
                except httpx.HTTPError:
                    health.append(599)
                burst_over.wait(0.25)

    threads = [threading.Thread(target=request, args=("claim", i)) for i in range(TOTAL // 2)]
    threads += [threading.Thread(target=request, args=("list", i)) for i in range(TOTAL // 2)]
    poller = threading.Thread(target=poll_health)
    poller.start()
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    wall = time.perf_counter() - start
    burst_over.set()
    poller.join(15)

    with httpx.Client(base_url=server, headers=operator, timeout=30) as client:
        after = [client.get("/api/v1/jobs/", params={"limit": 10}).status_code for _ in range(50)]

    lists = [t for kind, _, t in results if kind == "list"]
    polls = [t for kind, _, t in results if kind == "claim"]
    print(
        f"\nburst of {TOTAL} ({TOTAL // 2} long-polls of {WAIT:.0f} s): {TOTAL / wall:.1f} req/s "
        f"over {wall:.1f} s; lists p50 {_pct(lists, 0.5) * 1000:.0f} ms, "
        f"p99 {_pct(lists, 0.99) * 1000:.0f} ms; long-polls p50 {_pct(polls, 0.5):.1f} s, "
        f"max {max(polls):.1f} s; /healthz polled {len(health)} times"
    )
    assert len(results) == TOTAL
    assert [r for r in results if r[1] != 200] == []  # no 5xx, nothing refused
    assert health and set(health) == {200}
    assert after == [200] * 50
