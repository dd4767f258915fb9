"""What happened, from each face: real jobs run on a real daemon, then `lakeshore queues
stats`, `lakeshore stats` and the API say how many ended how, how long they waited and
ran, and which errors came up most."""

import pytest
from django.contrib.auth import get_user_model

from accounts.roles import grant
from jobs.models import Invocation
from tests.daemon.test_daemon_faults import daemons  # noqa: F401 - the fixture
from tests.support import builders
from tests.support.assertions import assert_error
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def isolation() -> str:
    return "pool"


def submit(sh, line: str) -> int:
    return int(sh.json(f"lakeshore jobs submit {line} --json")["id"])


@pytest.fixture
def ran(sh, daemons):  # noqa: F811 - the fixture imported above
    """Eight jobs run on queue e2e: four slept, three failed (two ways), one timed out;
    and one job killed while it waited in a queue nothing serves."""
    builders.queue(name="e2e")
    builders.queue(name="idle")
    for _ in range(4):
        submit(sh, "lakeshore.functions.sleep --queue e2e --kwargs '{\"seconds\": 0.3}'")
    disk = [
        submit(sh, "lakeshore.functions.fail --queue e2e --args '[\"disk full on /scratch\"]'")
        for _ in range(2)
    ]
    submit(sh, "lakeshore.functions.fail --queue e2e --args '[\"bad input 7\"]'")
    submit(sh, "lakeshore.functions.sleep --queue e2e --args '[30]' --timeout 1")
    waiting = submit(sh, "lakeshore.functions.echo --queue idle")
    sh(f"lakeshore jobs kill {waiting}")
    daemons("d1")
    wait_for(
        lambda: (
            not Invocation.objects.filter(queue="e2e", state__in=["queued", "running"]).exists()
        ),
        timeout=60,
        what="the eight jobs to end",
    )
    return {"disk": max(disk)}


def test_queue_stats_say_what_ended_how_long_it_took_and_why_it_failed(sh, ran):
    block = sh.json("lakeshore queues stats e2e --json")["last_hour"]

    assert [block[s] for s in ("succeeded", "failed", "killed", "timeout")] == [4, 3, 0, 1]
    assert block["per_minute"]["succeeded"] == pytest.approx(4 / 60, abs=0.01)
    assert block["timed"] == 8
    assert 300 <= block["run_ms"]["p50"] < 1000  # the four sleeps of 0.3 s
    assert block["run_ms"]["max"] >= 1000  # the one stopped at its 1 s time limit
    assert 0 <= block["wait_ms"]["p50"] <= block["wait_ms"]["p95"] <= block["wait_ms"]["max"]
    errors = {e["error"]: e for e in block["errors"]}
    assert errors["RuntimeError: disk full on /scratch"] == {
        "error": "RuntimeError: disk full on /scratch",
        "count": 2,
        "last_job": str(ran["disk"]),
    }
    assert errors["RuntimeError: bad input 7"]["count"] == 1
    assert block["errors"][0]["error"] == "RuntimeError: disk full on /scratch"  # most first
    assert len(block["errors"]) == 3  # and the time-out's own

    shown = sh("lakeshore queues stats e2e").stdout
    assert "Last hour (since " in shown
    assert "Succeeded:" in shown and "4 (0.07/min)" in shown
    assert "Timeout:" in shown and "1 (0.02/min)" in shown
    assert any(x.split() == ["Killed:", "0", "(0/min)"] for x in shown.splitlines())
    assert "Ran:" in shown and "p50 " in shown and "max 1." in shown
    assert "Top errors:" in shown
    line = next(x for x in shown.splitlines() if "disk full" in x)
    assert line.split()[:2] == ["2", str(ran["disk"])]


def test_fleet_stats_add_up_every_queue(sh, ran):
    fleet = sh.json("lakeshore stats --json")
    block = fleet["last_hour"]
    assert [block[s] for s in ("succeeded", "failed", "killed", "timeout")] == [4, 3, 1, 1]
    assert fleet["queues"] == 2 and fleet["pending"] == 0 and fleet["daemons"] == 1
    shown = sh("lakeshore stats").stdout
    assert "Queues:" in shown and "Killed:" in shown and "1 (0.02/min)" in shown


def test_the_day_window_and_a_window_that_is_none(sh, ran, operator):
    day = sh.json("lakeshore queues stats e2e --window 24h --json")
    assert "last_hour" not in day and day["last_day"]["succeeded"] == 4
    assert day["last_day"]["window"] == "24h"
    assert "Last day (since " in sh("lakeshore stats --window 24h").stdout
    refused = sh("lakeshore stats --window 2h", exit=2)
    assert "'2h' is not one of '1h', '24h'" in refused.stderr
    assert_error(operator.get("/api/v1/stats/?window=2h"), 400, "invalid", field="window")
    assert_error(
        operator.get("/api/v1/queues/e2e/stats/?window=7d"), 400, "invalid", field="window"
    )


def test_the_console_shows_the_same(ran, client):
    user = get_user_model().objects.create_user("vera", password="pw-x-12345")
    grant(user, "viewer")
    client.force_login(user)
    home = client.get("/").content.decode()
    dashboard = home[home.index('id="dashboard"') : home.index('id="queue-table"')]
    assert "<dt>Succeeded</dt><dd>4 " in dashboard
    assert '<dt>Failed</dt><dd><a href="/jobs/?state=failed">3</a>' in dashboard
    assert "<dt>Killed</dt><dd>1</dd>" in dashboard  # the one killed in queue idle
    assert f'<a href="/jobs/{ran["disk"]}/">{ran["disk"]}</a>' in dashboard
    assert "search=RuntimeError%3A%20disk%20full%20on%20/scratch" in dashboard
    assert 'aria-label="Jobs that ended per minute on every queue, last hour: succeeded' in home

    page = client.get("/queues/e2e/").content.decode()
    ended = page[page.index('id="queue-ended"') :]
    assert "<dt>Succeeded</dt><dd>4 " in ended and "<dt>Timed out</dt><dd>1</dd>" in ended
    assert "<dt>Killed</dt><dd>0</dd>" in ended  # not this queue's
    assert ">RuntimeError: disk full on /scratch</a>" in ended
    assert 'aria-label="How long jobs ran on queue e2e, last hour: p50' in ended
