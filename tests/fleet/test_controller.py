"""The elasticity controller against the real database, with the simulated provider."""

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import controller
from fleet.models import Daemon
from jobs.models import Invocation
from queues.models import Queue, QueueEvent
from queues.services import queue_transition
from tests.support import builders

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim():
    return builders.provider(name="sim", kind="simulated")


def _queue(sim, **elasticity):
    return builders.queue(name="train", provider="sim", elasticity_spec=elasticity)


def _backlog(n, queue="train"):
    Invocation.objects.bulk_create([Invocation(queue=queue, function="x.y") for _ in range(n)])


def _members():
    return Daemon.objects.live().subscribed_to("train")


def test_it_scales_up_to_min_at_once(sim):
    queue = _queue(sim, kind="pool_with_threshold", min=2, max=16, threshold=0.7)
    event = builders.tick_queue(queue.pk)
    assert (event.action, event.delta, event.desired) == ("scale_up", 2, 2)
    assert _members().count() == 2
    assert "pool_with_threshold wants 2" in event.reason and "launching 2" in event.reason


def test_it_follows_the_backlog_with_a_launch_cap_per_tick(sim, settings):
    settings.LAKESHORE_MAX_LAUNCH_PER_TICK = 10
    queue = _queue(sim, kind="pool_with_threshold", min=0, max=16, threshold=0.5)
    _backlog(7)  # ceil(7 / 0.5) = 14
    first = builders.tick_queue(queue.pk)
    second = builders.tick_queue(queue.pk)
    assert (first.wanted, first.delta, second.delta) == (14, 10, 4)
    assert _members().count() == 14
    third = builders.tick_queue(queue.pk)
    assert third.action == "tick_noop"


def test_simulated_daemons_come_up_and_keep_heartbeating(sim):
    sim.config = {"startup_seconds": 30}
    sim.save()
    queue = _queue(sim, kind="fixed", min=1)
    now = timezone.now()
    builders.tick_queue(queue.pk, now=now)
    assert _members().get().state == "provisioning"
    builders.tick_queue(queue.pk, now=now + timedelta(seconds=31))
    daemon = _members().get()
    assert daemon.state == "idle"
    assert daemon.last_heartbeat_at >= now + timedelta(seconds=31)


def test_it_scales_down_slowly_and_only_idle_daemons(sim, settings):
    settings.LAKESHORE_SCALE_DOWN_WINDOW = 300
    settings.LAKESHORE_STARTUP_GRACE = 0
    settings.LAKESHORE_MAX_TERMINATE_PER_TICK = 2
    queue = _queue(sim, kind="fully_elastic", min=0, max=10)
    start = timezone.now()
    _backlog(5)
    builders.tick_queue(queue.pk, now=start)
    builders.tick_queue(queue.pk, now=start + timedelta(seconds=1))  # provisioning → idle
    busy = _members().first()
    Daemon.objects.filter(pk=busy.pk).update(state="busy")
    Invocation.objects.filter(state="queued").delete()  # the work went away…
    Invocation.objects.create(queue="train", function="x.y", state="running", daemon=busy)

    held = builders.tick_queue(queue.pk, now=start + timedelta(seconds=60))
    assert held.action == "tick_noop" and held.wanted == 1 and held.desired == 5
    assert "scale-down window" in held.reason

    later = start + timedelta(seconds=400)  # the window has passed
    down = builders.tick_queue(queue.pk, now=later)
    assert (down.action, down.delta) == ("scale_down", -2)  # a few a tick
    builders.tick_queue(queue.pk, now=later + timedelta(seconds=10))
    builders.tick_queue(queue.pk, now=later + timedelta(seconds=20))
    assert list(_members().values_list("state", flat=True)) == ["busy"]  # never the busy one


def test_it_leaves_self_registered_daemons_alone(sim, settings):
    settings.LAKESHORE_STARTUP_GRACE = 0
    settings.LAKESHORE_SCALE_DOWN_WINDOW = 0
    queue = _queue(sim, kind="max_count", max=4)
    builders.daemon(queues=["train"], name="my-laptop", last_heartbeat_at=timezone.now())
    event = builders.tick_queue(queue.pk, now=timezone.now() + timedelta(seconds=5))
    assert event.action == "tick_noop" and "no idle daemon of its provider" in event.reason
    assert Daemon.objects.get(name="my-laptop").state == "idle"


def test_a_failed_launch_is_an_event_and_the_queue_backs_off(sim, settings):
    settings.LAKESHORE_TICK_SECONDS = 10
    sim.config = {"fail": "quota exceeded for p4d.24xlarge"}
    sim.save()
    queue = _queue(sim, kind="fixed", min=3)
    now = timezone.now()
    failed = builders.tick_queue(queue.pk, now=now)
    assert failed.action == "launch_failed"
    assert (
        "quota exceeded for p4d.24xlarge" in failed.reason and "backing off 20 s" in failed.reason
    )
    waiting = builders.tick_queue(queue.pk, now=now + timedelta(seconds=5))
    assert waiting.action == "tick_noop" and "failed launch" in waiting.reason
    again = builders.tick_queue(queue.pk, now=now + timedelta(seconds=21))
    assert again.action == "launch_failed" and "backing off 40 s" in again.reason
    sim.config = {}
    sim.save()
    ok = builders.tick_queue(queue.pk, now=now + timedelta(seconds=70))
    assert ok.action == "scale_up"
    queue.refresh_from_db()
    assert (queue.launch_failures, queue.launch_backoff_until) == (0, None)


def test_a_paused_queue_holds(sim):
    queue = _queue(sim, kind="fixed", min=2)
    queue_transition(name="train", action="pause")
    event = builders.tick_queue(queue.pk)
    assert (event.action, event.delta) == ("hold", 0)
    assert _members().count() == 0


def test_an_archived_queue_scales_to_zero(sim, settings):
    settings.LAKESHORE_STARTUP_GRACE = 0
    queue = _queue(sim, kind="fixed", min=2)
    now = timezone.now()
    builders.tick_queue(queue.pk, now=now)
    builders.tick_queue(queue.pk, now=now + timedelta(seconds=1))
    queue_transition(name="train", action="archive")
    event = builders.tick_queue(queue.pk, now=now + timedelta(seconds=2))
    assert (event.action, event.delta) == ("scale_down", -2)
    assert _members().count() == 0


def test_a_queue_without_a_provider_says_why_it_does_not_grow():
    queue = builders.queue(name="train", elasticity_spec={"kind": "fixed", "min": 1})
    event = builders.tick_queue(queue.pk)
    assert event.action == "tick_noop" and "no provider" in event.reason


def test_tick_covers_managed_queues_and_prunes_old_noops(sim, settings):
    settings.LAKESHORE_NOOP_RETENTION = 3600
    queue = _queue(sim, kind="fixed", min=0)
    builders.queue(name="plain")  # no elasticity: not the controller's
    old = QueueEvent.objects.create(
        queue=queue, at=timezone.now() - timedelta(hours=2), action="tick_noop",
        reason="-", daemons=0, busy=0, pending=0, utilization=0, desired=0,
    )  # fmt: skip
    kept = QueueEvent.objects.create(
        queue=queue, at=timezone.now() - timedelta(hours=2), action="scale_up",
        reason="-", daemons=0, busy=0, pending=0, utilization=0, desired=1, delta=1,
    )  # fmt: skip
    report = controller.tick()
    assert report == {"queues": 1, "skipped": 0, "pruned": 1, "providers": 0}
    assert not QueueEvent.objects.filter(pk=old.pk).exists()
    assert QueueEvent.objects.filter(pk=kept.pk).exists()
    assert not QueueEvent.objects.filter(queue__name="plain").exists()


def test_stats_shows_what_the_next_tick_would_do(sim, operator_client):
    _queue(sim, kind="pool_with_threshold", min=2, max=16, threshold=0.7)
    body = operator_client.get("/api/v1/queues/train/stats/").json()
    assert (body["desired"], body["next_action"]) == (2, "launch 2")
    builders.tick_queue(Queue.objects.get(name="train").pk)
    body = operator_client.get("/api/v1/queues/train/stats/").json()
    assert body["recent_actions"][0]["action"] == "scale_up"


def test_an_archived_queue_stops_being_ticked_once_its_daemons_are_gone(sim, settings):
    settings.LAKESHORE_STARTUP_GRACE = 0
    queue = _queue(sim, kind="fixed", min=1)
    now = timezone.now()
    builders.tick_queue(queue.pk, now=now)
    builders.tick_queue(queue.pk, now=now + timedelta(seconds=1))
    queue_transition(name="train", action="archive")
    assert controller.tick(now=now + timedelta(seconds=2))["queues"] == 1  # scales to zero
    assert _members().count() == 0
    assert controller.tick(now=now + timedelta(seconds=3))["queues"] == 0  # then rests
