"""One bad queue cannot stop the controller: a queue whose tick raises becomes a
`tick_failed` event with the reason and backs off, and every other queue still ticks."""

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.models import ApiToken
from fleet import controller
from fleet.models import Daemon, Provider
from jobs.models import Invocation
from queues import elasticity
from queues.models import Queue, QueueEvent
from tests.support import builders

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _tick_every_10_seconds(settings):
    settings.LAKESHORE_TICK_SECONDS = 10


def _corrupt(provider_name: str, config: dict) -> None:
    """A row the API would refuse (say, written before configs were checked)."""
    Provider.objects.filter(name=provider_name).update(config=config)


@pytest.fixture
def bad_then_good():
    """`broken` (created first, so ticked first) on a provider whose config row is
    corrupt, and `healthy` after it on a sound provider, each wanting one daemon."""
    builders.provider(name="bad", kind="simulated")
    builders.provider(name="good", kind="simulated")
    fixed = {"kind": "fixed", "min": 1}
    broken = builders.queue(name="broken", provider="bad", elasticity_spec=fixed)
    healthy = builders.queue(name="healthy", provider="good", elasticity_spec=fixed)
    _corrupt("bad", {"startup_seconds": "abc"})
    return broken, healthy


def _events(queue, action=None):
    rows = QueueEvent.objects.filter(queue=queue).order_by("id")
    return list(rows.filter(action=action) if action else rows)


def test_it_records_the_failure_and_still_ticks_the_queues_after_it(bad_then_good):
    broken, healthy = bad_then_good
    now = timezone.now()

    report = controller.tick(now=now)

    assert report["queues"] == 2 and report["skipped"] == 0
    [failed] = _events(broken)
    assert failed.action == "tick_failed" and failed.at == now
    assert failed.reason.startswith("tick failed: ValueError: could not convert string")
    assert "'abc'" in failed.reason and "skipping this queue for 20 s" in failed.reason
    assert not Daemon.objects.subscribed_to("broken").exists()
    [up] = _events(healthy)
    assert (up.action, up.delta) == ("scale_up", 1)
    assert Daemon.objects.live().subscribed_to("healthy").count() == 1
    broken.refresh_from_db()
    assert broken.tick_failures == 1
    assert broken.tick_backoff_until == now + timedelta(seconds=20)


def test_the_event_carries_the_signals_it_could_still_read(bad_then_good):
    broken, _ = bad_then_good
    Invocation.objects.bulk_create([Invocation(queue="broken", function="x.y") for _ in range(3)])
    builders.daemon(queues=["broken"], name="laptop", last_heartbeat_at=timezone.now())

    controller.tick()

    [failed] = _events(broken)
    assert (failed.daemons, failed.busy, failed.pending, failed.delta) == (1, 0, 3, 0)


def test_the_signals_are_zeros_when_they_cannot_be_read(bad_then_good, monkeypatch):
    broken, healthy = bad_then_good

    def unreadable(queue):
        raise RuntimeError(f"signals of {queue.name} unreadable")

    monkeypatch.setattr("queues.services.queue_signals", unreadable)
    controller.tick()

    [first] = _events(broken)
    [second] = _events(healthy)
    assert "ValueError" in first.reason  # its driver failed before the signals were read
    assert "RuntimeError: signals of healthy unreadable" in second.reason
    for failed in (first, second):
        assert failed.action == "tick_failed"
        assert (failed.daemons, failed.busy, failed.pending, failed.utilization) == (0, 0, 0, 0)


def test_the_failing_queue_is_skipped_until_its_backoff_ends_then_retried(bad_then_good):
    broken, healthy = bad_then_good
    now = timezone.now()
    controller.tick(now=now)

    waiting = controller.tick(now=now + timedelta(seconds=19))
    assert waiting["skipped"] == 1 and waiting["queues"] == 1  # healthy still ticks
    assert len(_events(broken)) == 1  # no event while backing off: no noise
    assert len(_events(healthy)) == 2

    controller.tick(now=now + timedelta(seconds=20))
    again = _events(broken, "tick_failed")
    assert len(again) == 2 and "2 failed tick(s) in a row" in again[-1].reason
    assert "skipping this queue for 40 s" in again[-1].reason

    _corrupt("bad", {"startup_seconds": 0})  # repaired
    controller.tick(now=now + timedelta(seconds=59))
    assert len(_events(broken)) == 2
    controller.tick(now=now + timedelta(seconds=60))
    assert _events(broken)[-1].action == "scale_up"
    broken.refresh_from_db()
    assert (broken.tick_failures, broken.tick_backoff_until) == (0, None)


def test_the_backoff_is_capped(bad_then_good):
    broken, _ = bad_then_good
    Queue.objects.filter(pk=broken.pk).update(tick_failures=30)

    controller.tick()

    [failed] = _events(broken)
    assert f"skipping this queue for {elasticity.BACKOFF_MAX_SECONDS} s" in failed.reason
    broken.refresh_from_db()
    assert broken.tick_failures == 31


def test_a_long_error_is_cut_to_fit_and_keeps_the_backoff(bad_then_good):
    broken, _ = bad_then_good
    _corrupt("bad", {"startup_seconds": "x" * 2000})

    controller.tick()

    [failed] = _events(broken)
    assert len(failed.reason) == 500
    assert failed.reason.endswith("skipping this queue for 20 s")


def test_a_failed_tick_leaves_nothing_of_what_it_did(settings):
    """The local driver records a daemon and mints its token, then trips over the
    corrupt config: the tick's transaction is rolled back, so neither is left and no
    process is started."""
    builders.provider(name="here", kind="local", config={"concurrency": 1})
    fixed = {"kind": "fixed", "min": 1}
    queue = builders.queue(name="train", provider="here", elasticity_spec=fixed)
    _corrupt("here", {"concurrency": "lots"})
    tokens = ApiToken.objects.count()

    controller.tick()

    [failed] = _events(queue)
    assert failed.action == "tick_failed" and "ValueError" in failed.reason
    assert not Daemon.objects.exists()
    assert ApiToken.objects.count() == tokens


def test_it_logs_the_exception(bad_then_good, caplog):
    with caplog.at_level(logging.ERROR, logger="fleet.controller"):
        controller.tick()

    [record] = [r for r in caplog.records if r.name == "fleet.controller"]
    assert "failed" in record.getMessage()
    assert record.exc_info and record.exc_info[0] is ValueError


def test_the_events_api_shows_the_tick_failed_row(bad_then_good, operator_client):
    controller.tick()

    body = operator_client.get("/api/v1/queues/broken/events/").json()

    assert [e["action"] for e in body] == ["tick_failed"]
    assert "ValueError" in body[0]["reason"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_lakeshore_queues_events_shows_the_tick_failed_row(bad_then_good, sh):  # noqa: F811
    controller.tick()

    result = sh("lakeshore queues events broken")

    assert "tick_failed" in result.stdout and "ValueError" in result.stdout
