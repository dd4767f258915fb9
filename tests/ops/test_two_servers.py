"""Two servers, one database (issue 21): two `make run`-style web servers on two ports
share one PostgreSQL. A submit on one wakes a daemon long-polling on the other at once
(LISTEN/NOTIFY crosses servers), and /metrics on either shows the database's figures
for every queue, and the same counters and histograms: work done through one shows in
the other's. The negative controls: a daemon of another queue is not woken, and waits
its whole wait; a server's counts are not in the other's scrape before it flushes.
(The controller ticking once whichever beat fires: tests/fleet/test_beat_once.py.)"""

import re
import threading
import time
from collections import Counter

import httpx
import pytest
from django.db import connection
from django.db.models import Sum
from prometheus_client.parser import text_string_to_metric_families

from jobs.models import Invocation
from jobs.transitions.states import TERMINAL
from tests.support import builders
from tests.support.servers import environment, gunicorn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("load"),  # one at a time: each loads both cores
]

ECHO = "lakeshore.functions.echo"
# The woken claim's wait: long, so that "at once" and "at its wait's end" are far apart
# (how soon is the bench's two-server row: bench/results/latest.md). The control's wait,
# which it waits whole.
WAIT = 30.0
CONTROL_WAIT = 8.0


def _environment(var) -> dict:
    var.mkdir()
    return environment(var, LAKESHORE_DB_POOL_MAX="8", LAKESHORE_WEB_WORKERS="1")


def _claim(base: str, token: str, daemon_id: int, out: dict, wait: float) -> None:
    started = time.monotonic()
    response = httpx.post(
        f"{base}/api/v1/daemons/{daemon_id}/claim/",
        json={"wait": wait},
        headers={"Authorization": f"Bearer {token}"},
        timeout=wait + 10,
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
            threading.Thread(target=_claim, args=(b, token, waiting.pk, woken, WAIT)),
            threading.Thread(target=_claim, args=(b, token, elsewhere.pk, control, CONTROL_WAIT)),
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
    # at once: long before its wait would end (WAIT - 1.5 s after the submit)
    assert woken["answered"] - submitted < WAIT / 3
    assert control["claimed"] == [] and control["took"] >= CONTROL_WAIT - 0.5
    assert gauges_a and gauges_a == gauges_b
    assert any(
        line.startswith("lakeshore_queue_running") and line.endswith(" 1.0") for line in gauges_a
    )


# ---------------------------------------------------------------------------- /metrics


def _counters(base: str, token: str) -> dict:
    """Queue "two"'s counters and histograms in a scrape of `base`: {sample: value}."""
    text = httpx.get(
        f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ).text
    return {
        (sample.name, *sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if family.type in ("counter", "histogram") and sample.labels.get("queue") == "two"
    }


def _in_database() -> dict:
    """What the counters must say, from the invocations: {sample: value}."""
    found = {
        ("lakeshore_invocations_claimed_total", ("queue", "two")): float(
            Invocation.objects.filter(queue="two").aggregate(n=Sum("attempts"))["n"] or 0
        )
    }
    ended = Invocation.objects.filter(queue="two", state__in=TERMINAL)
    for state, n in Counter(ended.values_list("state", flat=True)).items():
        found[("lakeshore_invocations_ended_total", ("queue", "two"), ("state", state))] = n
    return found


def _run(base: str, bootstrap: str, token: str, states: list[str]) -> None:
    """Submit one job per state through `base`, then a daemon registered there claims
    them and reports each with its state."""
    headers = {"Authorization": f"Bearer {token}"}
    for i in range(len(states)):
        response = httpx.post(
            f"{base}/api/v1/jobs/",
            json={"function": ECHO, "queue": "two", "args": [i]},
            headers=headers,
            timeout=10,
        )
        assert response.status_code == 201, response.text
    daemon = httpx.post(
        f"{base}/api/v1/daemons/register/",
        json={"name": "d", "queues": ["two"]},
        headers={"Authorization": f"Bearer {bootstrap}"},
        timeout=10,
    ).json()
    mine = {"Authorization": f"Bearer {daemon['token']}"}
    claimed = httpx.post(
        f"{base}/api/v1/daemons/{daemon['id']}/claim/",
        json={"limit": len(states)},
        headers=mine,
        timeout=10,
    ).json()
    assert len(claimed) == len(states), claimed
    outcomes = [
        {"invocation": job["id"], "attempt": 1, "state": state, "result": 1, "error": "x"}
        for job, state in zip(claimed, states, strict=True)
    ]
    response = httpx.post(
        f"{base}/api/v1/daemons/{daemon['id']}/complete/", json=outcomes, headers=mine, timeout=10
    )
    assert response.status_code == 200 and all(a["ok"] for a in response.json()), response.text


def _shown(counters: dict) -> dict:
    """The counters of a scrape that _in_database can say (not the histograms)."""
    return {key: v for key, v in counters.items() if key[0].endswith("_total") and v}


def _until(condition, seconds: float) -> float:
    """Waits until condition() holds; fails after `seconds`. Returns how long it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > seconds:
            pytest.fail(f"not within {seconds} s")
        time.sleep(0.1)
    return time.monotonic() - started


def test_work_through_one_server_shows_in_the_others_counters(tmp_path):
    """Server a adds its counts to the database only before a scrape it serves and when
    it stops (a flush period of an hour); server b every second, as by default. What a
    did is not in b's scrape until a flushes (the negative control: the counts travel
    through the database, nothing else), then it is, in every counter and histogram
    alike; what b did shows in a's scrape within about a second, through b's thread; and
    what a counted last reaches b when a stops."""
    builders.queue(name="two")
    bootstrap, token = builders.token("daemon"), builders.token("operator")
    connection.close()
    quiet = {**_environment(tmp_path / "a"), "LAKESHORE_METRICS_FLUSH_SECONDS": "3600"}
    with (
        gunicorn(tmp_path / "a", quiet) as (a, server_a),
        gunicorn(tmp_path / "b", _environment(tmp_path / "b")) as (b, _),
    ):
        _run(a, bootstrap, token, ["succeeded", "succeeded", "failed"])
        first = _in_database()
        assert first[("lakeshore_invocations_claimed_total", ("queue", "two"))] == 3
        time.sleep(1.5)  # longer than a default flush period
        assert _counters(b, token) == {}  # a has not flushed: b shows none of it

        assert _shown(_counters(a, token)) == first  # a's scrape flushes a's counts
        on_a, on_b = _counters(a, token), _counters(b, token)
        assert on_b == on_a and _shown(on_b) == first  # histograms included
        assert on_b[("lakeshore_invocation_run_seconds_count", ("queue", "two"))] == 3

        _run(b, bootstrap, token, ["timeout"])
        second = _in_database()
        took = _until(lambda: _shown(_counters(a, token)) == second, 10)

        _run(a, bootstrap, token, ["succeeded"])
        third = _in_database()
        assert _shown(_counters(b, token)) == second  # a has not flushed its last work
        server_a.terminate()  # a stops: its workers write what they counted
        server_a.wait(30)
        assert _shown(_counters(b, token)) == third
    print(f"\nb's counts in a's scrape after {took:.2f} s (b flushes every second)")
