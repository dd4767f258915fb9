"""GET /metrics under the production server: gunicorn with `make run`'s configuration (two
worker processes). Invocations are submitted, claimed, completed and killed through its
HTTP API by concurrent clients, so both workers count; a separate `manage.py reap`
process (what the Celery worker runs) times one out. Every process adds its counts to
the database (lakeshore_admin/metrics.py), so every scrape, whichever worker serves it,
gives the database's totals (once each process's last flush, at most a second old, is
in); so it does after a worker is stopped and replaced, and after the whole server is
restarted (no reset). What the Celery worker counts shows in the web's scrape too. The
negative control (a process's counts are not in another's scrape before its flush):
tests/ops/test_two_servers.py."""

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from django.db import connection
from django.db.models import Sum
from prometheus_client.parser import text_string_to_metric_families

from jobs.models import Invocation
from jobs.transitions.states import TERMINAL
from lakeshore_admin import metrics
from queues.models import MetricTotal, QueueEvent
from tests.support import builders, stack
from tests.support.servers import database_url, free_port, gunicorn

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
ECHO = "lakeshore.functions.echo"
QUEUES = ["m", ""]  # a named queue and the default one
SUBMITS = 40  # per queue
DAEMONS = 8


def _env(tmp_path) -> dict:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "lakeshore_admin.settings",
        "DATABASE_URL": database_url(),
        "LAKESHORE_DB_POOL_MAX": "6",
        "LAKESHORE_VAR_DIR": str(tmp_path),
        "LAKESHORE_STATIC_FROM_FINDERS": "1",
        "LAKESHORE_WEB_WORKERS": "2",
        "LAKESHORE_WEB_THREADS": "16",
        "LAKESHORE_RETRY_BACKOFF": "0",
    }


@pytest.fixture
def server(tmp_path):
    env = {**_env(tmp_path), "PORT": str(free_port())}
    with gunicorn(tmp_path, env, ready="/readyz") as (base, proc):
        yield base, proc, env


def call(base: str, token: str, method: str, path: str, body=None) -> httpx.Response:
    """One request on a connection of its own: the kernel hands each to either worker."""
    headers = {"Authorization": f"Bearer {token}", "Connection": "close"}
    response = httpx.request(method, base + path, json=body, headers=headers, timeout=30)
    assert response.status_code < 300, (path, response.status_code, response.text)
    return response


def outcome(invocation: dict) -> str:
    n = invocation["args"][0] if invocation["args"] else 0
    return {0: "failed", 1: "timeout"}.get(n % 5, "succeeded")


def run_daemon(base: str, token: str, queue: str, index: int) -> None:
    """Claim and complete until the queue is empty, like `lakeshore daemon run`."""
    registered = call(
        base,
        token,
        "POST",
        "/api/v1/daemons/register/",
        {"name": f"d{index}", "queues": [queue] if queue else []},
    ).json()
    me, token = registered["id"], registered["token"]  # from now on, its own credential
    while True:
        claimed = call(base, token, "POST", f"/api/v1/daemons/{me}/claim/", {"limit": 3}).json()
        if not claimed:
            return
        outcomes = [
            {
                "invocation": c["id"],
                "attempt": c["attempts"],
                "state": outcome(c),
                "result": c["args"],
                "error": "on purpose",
            }
            for c in claimed
        ]
        call(base, token, "POST", f"/api/v1/daemons/{me}/complete/", outcomes)


def parse(text: str) -> dict[tuple, float]:
    return {
        (sample.name, *sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def totals(samples: dict) -> dict:
    """The counters and histogram counts of a scrape, by queue (and state)."""
    found: dict = {"ended": Counter(), "claimed": Counter(), "waits": Counter(), "runs": Counter()}
    names = {
        "lakeshore_invocations_ended_total": "ended",
        "lakeshore_invocations_claimed_total": "claimed",
        "lakeshore_invocation_queue_wait_seconds_count": "waits",
        "lakeshore_invocation_run_seconds_count": "runs",
    }
    for (name, *labels), value in samples.items():
        if name in names and value:
            labels = dict(labels)
            key = (labels["queue"], labels["state"]) if "state" in labels else labels["queue"]
            found[names[name]][key] += value
    return found


def in_database() -> dict:
    ended = Invocation.objects.filter(state__in=TERMINAL)
    attempts = Invocation.objects.order_by().values_list("queue").annotate(n=Sum("attempts"))
    claimed = Counter({queue: n for queue, n in attempts if n})
    ran = ended.filter(started_at__isnull=False)
    return {
        "ended": Counter(ended.values_list("queue", "state")),
        "claimed": claimed,
        "waits": claimed,
        "runs": Counter(ran.values_list("queue", flat=True)),
    }


def scrape(base: str, token: str) -> dict:
    response = call(base, token, "GET", "/metrics")
    return parse(response.text)


def in_the_table() -> dict:
    """The totals as the table holds them, read by this process."""
    rows = MetricTotal.objects.values_list("name", "labels", "value")
    samples = {
        (sample.name, *sorted(sample.labels.items())): sample.value
        for family in metrics.families(rows)
        for sample in family.samples
    }
    return totals(samples)


def settled(base: str, token: str, expected: dict) -> int:
    """Scrapes until one gives the expected totals (every process's last counts are
    flushed within about a second); fails after 15 s. Returns how many it took."""
    deadline = time.monotonic() + 15
    scrapes = 0
    while True:
        scrapes += 1
        found = totals(scrape(base, token))
        if found == expected:
            return scrapes
        if time.monotonic() > deadline:
            assert found == expected
        time.sleep(0.2)


def test_every_scrape_gives_the_databases_totals_whichever_worker_serves_it(server, tmp_path):
    base, master, env = server
    builders.queue(name="m")
    operator, daemon, viewer = (builders.token(role) for role in ("operator", "daemon", "viewer"))
    connection.close()  # the server's processes see the rows; this one needs no lock
    workers = {child.pid for child in psutil.Process(master.pid).children()}
    assert len(workers) == 2

    assert totals(scrape(base, viewer)) == totals({})  # a fresh database: nothing yet
    # Submit concurrently, one by one and in batches; two attempts for half of them.
    items = [
        {"function": ECHO, "queue": q, "args": [i], "max_attempts": 1 + i % 2}
        for q in QUEUES
        for i in range(SUBMITS)
    ]
    with ThreadPoolExecutor(8) as pool:
        singles = list(
            pool.map(lambda item: call(base, operator, "POST", "/api/v1/jobs/", item), items[::2])
        )
        list(
            pool.map(
                lambda batch: call(base, operator, "POST", "/api/v1/jobs/", batch),
                [items[1::4], items[3::4]],
            )
        )
    # Kill a few while queued, in both queues.
    for response in singles[:2] + singles[-2:]:
        call(base, operator, "POST", f"/api/v1/jobs/{response.json()['id']}/kill/")
    # One claimed by a daemon that never reports: the reaper will time it out.
    holder = call(
        base, daemon, "POST", "/api/v1/daemons/register/", {"name": "holder", "queues": ["m"]}
    ).json()
    [held] = call(
        base, holder["token"], "POST", f"/api/v1/daemons/{holder['id']}/claim/", {"limit": 1}
    ).json()
    # Daemons on both queues, concurrently, until the queues are empty.
    threads = [
        threading.Thread(target=run_daemon, args=(base, daemon, QUEUES[i % 2], i))
        for i in range(DAEMONS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    Invocation.objects.filter(pk=int(held["id"])).update(timeout_s=1)
    time.sleep(1.1)
    reaper = subprocess.run(
        [sys.executable, "manage.py", "reap"],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert reaper.returncode == 0, reaper.stderr
    assert Invocation.objects.get(pk=int(held["id"])).state == "timeout"

    expected = in_database()
    assert expected["ended"][("m", "killed")] == expected["ended"][("", "killed")] == 2
    assert expected["ended"][("m", "timeout")] >= 1  # the reaper's, which exited since
    assert not Invocation.objects.filter(state="queued").exists()

    waited = settled(base, viewer, expected)
    for _ in range(10):
        assert totals(scrape(base, viewer)) == expected
    assert in_the_table() == expected  # the scrape is the table

    # A worker stopped and replaced: what it counted still counts.
    os.kill(min(workers), signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = {child.pid for child in psutil.Process(master.pid).children()}
        if len(now) == 2 and now != workers:
            break
        time.sleep(0.2)
    else:
        pytest.fail("gunicorn did not replace the stopped worker")
    for _ in range(10):
        assert totals(scrape(base, viewer)) == expected
    assert "Traceback" not in (tmp_path / "gunicorn.log").read_text()

    # The whole server stopped and started again (a deploy, `make run`): no reset.
    master.terminate()
    master.wait(30)
    again = tmp_path / "again"
    again.mkdir()
    with gunicorn(again, {**env, "PORT": str(free_port())}, ready="/readyz") as (restarted, _):
        for _ in range(4):
            assert totals(scrape(restarted, viewer)) == expected
    ended = sum(expected["ended"].values())
    print(
        f"\n{ended} ended, {sum(expected['claimed'].values())} claims by 2 web workers and "
        f"the reaper; equal to the database after {waited} scrape(s), then 20 scrapes and "
        f"a restarted server's 4 all equal"
    )


def test_what_the_celery_worker_counts_shows_in_the_webs_scrape(tmp_path):
    """The controller's actions are counted in the Celery worker's process (its beat
    ticks every 2 s here), a process of its own like a worker on another host: its
    scale_up shows in the web server's scrape, through the database."""
    builders.provider(name="sim", kind="simulated")
    builders.queue(name="grows", provider="sim", elasticity_spec={"kind": "fixed", "min": 1})
    viewer = builders.token("viewer")
    connection.close()
    wanted = ("lakeshore_controller_actions_total", ("action", "scale_up"), ("queue", "grows"))
    with stack.running(tmp_path, tick_seconds=2) as (base, _):
        deadline = time.monotonic() + 30
        while not QueueEvent.objects.filter(queue__name="grows", action="scale_up").exists():
            assert time.monotonic() < deadline, "no scale_up within 30 s"
            time.sleep(0.2)
        while scrape(base, viewer).get(wanted, 0) != 1:
            assert time.monotonic() < deadline, "the scale_up is not in the scrape"
            time.sleep(0.2)
        assert QueueEvent.objects.filter(action="scale_up").count() == 1
