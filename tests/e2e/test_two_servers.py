"""Two servers, one database (issue 21): two `make run`-style web servers on two ports
share one PostgreSQL. A submit on one wakes a daemon long-polling on the other at once
(LISTEN/NOTIFY crosses servers), and /metrics on either shows the database's figures
for every queue. The negative control: a daemon of another queue is not woken, and
waits its whole wait. (The controller ticking once whichever beat fires:
tests/queues/test_beat_once.py.)"""

import os
import re
import threading
import time

import httpx
import pytest
from django.db import connection

from tests import builders
from tests.e2e.servers import free_port, gunicorn
from tests.e2e.test_burst import _database_url

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("load"),  # one at a time: each loads both cores
]

ECHO = "lakeshore.functions.echo"
WAIT = 8.0
WAKE_BOUND = 1.0  # seconds (the bench measures the latency: bench/results/latest.md)


def _environment(var) -> dict:
    var.mkdir()
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "lakeshore_admin.settings",
        "DATABASE_URL": _database_url(),
        "LAKESHORE_DB_POOL_MAX": "8",
        "LAKESHORE_VAR_DIR": str(var),
        "LAKESHORE_STATIC_FROM_FINDERS": "1",
        "LAKESHORE_WEB_WORKERS": "1",
        "PORT": str(free_port()),
    }


def _claim(base: str, token: str, daemon_id: int, out: dict) -> None:
    started = time.monotonic()
    response = httpx.post(
        f"{base}/api/v1/daemons/{daemon_id}/claim/",
        json={"wait": WAIT},
        headers={"Authorization": f"Bearer {token}"},
        timeout=WAIT + 10,
    )
    out["answered"] = time.monotonic()
    out["took"] = out["answered"] - started
    out["claimed"] = response.json()


def _queue_gauges(base: str, token: str) -> list[str]:
    text = httpx.get(
        f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ).text
    return sorted(
        line
        for line in text.splitlines()
        if re.match(r'lakeshore_queue_(pending|running|daemons)\w*\{[^}]*queue="two"', line)
    )


def test_a_submit_on_one_server_wakes_a_daemon_waiting_on_the_other(tmp_path):
    builders.queue(name="two")
    builders.queue(name="other")
    waiting = builders.daemon(queues=["two"])
    elsewhere = builders.daemon(queues=["other"])
    token = builders.token("operator")
    connection.close()
    with (
        gunicorn(tmp_path / "a", _environment(tmp_path / "a")) as (a, _),
        gunicorn(tmp_path / "b", _environment(tmp_path / "b")) as (b, _),
    ):
        woken, control = {}, {}
        threads = [
            threading.Thread(target=_claim, args=(b, token, waiting.pk, woken)),
            threading.Thread(target=_claim, args=(b, token, elsewhere.pk, control)),
        ]
        for thread in threads:
            thread.start()
        time.sleep(1.5)  # both claims are parked on server b
        response = httpx.post(
            f"{a}/api/v1/jobs/",
            json={"function": ECHO, "queue": "two"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        submitted = time.monotonic()
        assert response.status_code == 201, response.text
        for thread in threads:
            thread.join()
        gauges_a, gauges_b = _queue_gauges(a, token), _queue_gauges(b, token)
    assert [job["id"] for job in woken["claimed"]] == [response.json()["id"]]
    assert woken["answered"] - submitted < WAKE_BOUND
    assert control["claimed"] == [] and control["took"] >= WAIT - 0.5
    assert gauges_a and gauges_a == gauges_b
    assert any(
        line.startswith("lakeshore_queue_running") and line.endswith(" 1.0") for line in gauges_a
    )
