"""The queues' time series (queues/samples.py): every controller tick samples every
queue that is not archived, at most once a minute, in a fixed number of statements."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import controller
from jobs.models import Invocation
from jobs.retention import retention_sweep
from queues import samples
from queues.models import Queue, QueueEvent, QueueSample
from queues.services import queue_stats, queue_transition
from tests.support import builders

pytestmark = pytest.mark.django_db

# the middle of a minute: a tick now and one 20 s later fall in the same minute
NOW = datetime(2026, 3, 1, 12, 30, 20, tzinfo=UTC)
MINUTE = NOW.replace(second=0)


@pytest.fixture
def sim():
    return builders.provider(name="sim", kind="simulated")


def _jobs(queue: str, n: int, state: str = "queued"):
    Invocation.objects.bulk_create(
        [Invocation(queue=queue, function="x.y", state=state) for _ in range(n)]
    )


def _sample(queue: str) -> QueueSample:
    return QueueSample.objects.get(queue__name=queue)


def _row(sample: QueueSample) -> dict:
    fields = ("pending", "running", "daemons", "busy", "desired", "utilization")
    return {name: getattr(sample, name) for name in fields}


def test_a_tick_samples_every_queue_but_archived_ones_once(sim):
    builders.queue(name="elastic", provider="sim", elasticity_spec={"kind": "fixed", "min": 0})
    builders.queue(name="plain")
    builders.queue(name="held")
    queue_transition(name="held", action="pause")
    builders.queue(name="gone")
    queue_transition(name="gone", action="archive")

    controller.tick(now=NOW)

    rows = QueueSample.objects.order_by("queue__name").values_list("queue__name", "at")
    assert list(rows) == [("elastic", MINUTE), ("held", MINUTE), ("plain", MINUTE), (None, MINUTE)]
    # (None: the default queue's)


def test_a_second_tick_in_the_same_minute_writes_nothing_and_the_next_minute_does(sim):
    builders.queue(name="elastic", provider="sim", elasticity_spec={"kind": "fixed", "min": 0})
    builders.queue(name="plain")
    controller.tick(now=NOW)
    _jobs("plain", 3)
    with CaptureQueriesContext(connection) as ctx:
        assert samples.record(now=NOW + timedelta(seconds=20)) == 0
    assert len(ctx) == 1  # the read found every queue sampled: nothing more
    controller.tick(now=NOW + timedelta(seconds=39))
    assert QueueSample.objects.count() == 3  # and the default queue's
    assert _sample("plain").pending == 0  # the minute's first tick stands

    controller.tick(now=NOW + timedelta(seconds=40))  # 12:31:00
    assert QueueSample.objects.count() == 6
    later = QueueSample.objects.get(queue__name="plain", at=MINUTE + timedelta(minutes=1))
    assert later.pending == 3


def test_a_plain_queues_sample_is_its_real_state():
    queue = builders.queue(name="plain")
    _jobs("plain", 4)
    _jobs("plain", 2, state="running")
    _jobs("plain", 5, state="succeeded")
    _jobs("other", 7)  # another queue's rows stay its own
    builders.queue(name="other")
    builders.daemon(queues=["plain"], state="busy")
    builders.daemon(queues=["plain", "other"], state="idle")
    builders.daemon(queues=["plain"], state="provisioning")
    builders.daemon(queues=["plain"], state="draining")  # live, but not D
    builders.daemon(queues=["plain"], state="terminated")

    controller.tick(now=NOW)

    stats = queue_stats(queue)
    assert _row(_sample("plain")) == {
        "pending": stats["pending"],
        "running": stats["running"],
        "daemons": stats["daemons"],
        "busy": stats["busy"],
        "desired": stats["desired"],
        "utilization": stats["utilization"],
    }
    assert _row(_sample("plain")) == {
        "pending": 4,
        "running": 2,
        "daemons": 3,
        "busy": 1,
        "desired": 3,  # no elasticity: the controller wants what is there
        "utilization": round(1 / 3, 4),
    }
    assert (_sample("other").pending, _sample("other").daemons) == (7, 1)


def test_a_managed_queues_sample_is_what_its_tick_saw_and_wanted(sim):
    queue = builders.queue(
        name="train",
        provider="sim",
        elasticity_spec={"kind": "pool_with_threshold", "min": 0, "max": 16, "threshold": 0.5},
    )
    _jobs("train", 3)
    _jobs("train", 1, state="running")
    builders.daemon(queues=["train"], state="busy")

    controller.tick(now=NOW)

    event = QueueEvent.objects.get(queue=queue)
    assert event.action == "scale_up" and event.desired == 8  # ceil((1 + 3) / 0.5)
    assert _row(_sample("train")) == {
        "pending": event.pending,
        "running": 1,
        "daemons": event.daemons,
        "busy": event.busy,
        "desired": event.desired,
        "utilization": event.utilization,
    }
    assert (event.pending, event.daemons, event.busy) == (3, 1, 1)


def test_a_managed_queue_the_tick_skipped_keeps_its_last_desired(sim):
    queue = builders.queue(
        name="train", provider="sim", elasticity_spec={"kind": "fixed", "min": 4}
    )
    controller.tick(now=NOW - timedelta(minutes=5))
    assert QueueEvent.objects.get(queue=queue).desired == 4
    Queue.objects.filter(pk=queue.pk).update(
        tick_failures=1, tick_backoff_until=NOW + timedelta(minutes=1)
    )
    report = controller.tick(now=NOW)
    assert report["skipped"] == 1
    sample = QueueSample.objects.get(queue=queue, at=MINUTE)
    assert (sample.daemons, sample.desired) == (4, 4)


def test_an_archived_queue_the_controller_still_ticks_is_sampled(sim, settings):
    settings.LAKESHORE_STARTUP_GRACE = 0
    queue = builders.queue(
        name="train", provider="sim", elasticity_spec={"kind": "fixed", "min": 2}
    )
    controller.tick(now=NOW - timedelta(minutes=5))
    controller.tick(now=NOW - timedelta(minutes=4))  # provisioning → idle
    queue_transition(name="train", action="archive")
    controller.tick(now=NOW)
    sample = QueueSample.objects.get(queue=queue, at=MINUTE)
    assert (sample.daemons, sample.desired) == (2, 0)  # scaling to zero


def test_pending_is_capped_like_the_queue_page(monkeypatch):
    monkeypatch.setattr("queues.services.PENDING_CAP", 3)
    builders.queue(name="plain")
    _jobs("plain", 10)
    samples.record(now=NOW)
    assert _sample("plain").pending == 4  # the cap + 1: "more than 3"


def test_retention_deletes_old_samples():
    builders.queue(name="plain")
    samples.record(now=NOW)
    samples.record(now=timezone.now())
    counts = retention_sweep()
    assert counts["samples"] == 2  # plain's and the default queue's
    assert QueueSample.objects.count() == 2
    assert all(s.at > timezone.now() - timedelta(minutes=2) for s in QueueSample.objects.all())


def test_deleting_a_queue_deletes_its_samples():
    queue = builders.queue(name="plain")
    samples.record(now=NOW)
    Queue.objects.filter(pk=queue.pk).delete()
    assert not QueueSample.objects.filter(queue__isnull=False).exists()


# ---------------------------------------------------------------------------- cost


def _tick_queries(now) -> int:
    with CaptureQueriesContext(connection) as ctx:
        controller.tick(now=now)
    return len(ctx)


def test_a_tick_over_1_or_20_plain_queues_costs_the_same_queries():
    builders.queue(name="q0")
    _jobs("q0", 2)
    one = _tick_queries(NOW)
    assert QueueSample.objects.count() == 2  # and the default queue's
    for i in range(1, 20):
        builders.queue(name=f"q{i}")
        _jobs(f"q{i}", 2)
        _jobs(f"q{i}", 1, state="running")
        builders.daemon(queues=[f"q{i}"], state="busy")
    assert _tick_queries(NOW + timedelta(minutes=1)) == one
    assert QueueSample.objects.filter(at=MINUTE + timedelta(minutes=1)).count() == 21


def test_sampling_1_or_20_ticked_queues_costs_the_same_queries(sim):
    def record_queries(now) -> int:
        managed = Queue.objects.exclude(elasticity_kind="").values_list("pk", flat=True)
        events = [builders.tick_queue(pk, now=now) for pk in managed]
        with CaptureQueriesContext(connection) as ctx:
            # + plain + the default queue
            assert samples.record(now=now, events=events) == len(events) + 2
        return len(ctx)

    spec = {"kind": "fixed", "min": 1}
    builders.queue(name="q0", provider="sim", elasticity_spec=spec)
    builders.queue(name="plain")  # not ticked: read by the same grouped queries
    one = record_queries(NOW)
    for i in range(1, 20):
        builders.queue(name=f"q{i}", provider="sim", elasticity_spec=spec)
    assert record_queries(NOW + timedelta(minutes=1)) == one
    assert one == 4  # the queues with their pending, running, the daemons, the insert


# ---------------------------------------------------------------------------- reading


def _samples_at(queue, *rows):
    QueueSample.objects.bulk_create(
        [
            QueueSample(
                queue=queue, at=at, pending=p, running=0, daemons=d, busy=0, desired=d,
                utilization=0,
            )
            for at, p, d in rows
        ]
    )  # fmt: skip


def test_a_series_is_the_range_oldest_first_and_a_day_in_five_minute_buckets():
    queue = builders.queue(name="plain")
    other = builders.queue(name="other")
    _samples_at(
        queue,
        (MINUTE - timedelta(minutes=61), 99, 9),  # before the hour
        (MINUTE - timedelta(minutes=2), 30, 1),
        (MINUTE - timedelta(minutes=1), 20, 2),
        (MINUTE, 12, 3),
    )
    _samples_at(other, (MINUTE, 1000, 1))
    hour = samples.series(queue, "hour", now=NOW)
    assert [(p.at, p.pending, p.daemons) for p in hour] == [
        (MINUTE - timedelta(minutes=2), 30, 1),
        (MINUTE - timedelta(minutes=1), 20, 2),
        (MINUTE, 12, 3),
    ]
    day = samples.series(queue, "day", now=NOW)
    # 12:30 is a bucket's start: 12:28 and 12:29 share the 12:25 bucket (its highest)
    assert [(p.at, p.pending, p.daemons) for p in day] == [
        (MINUTE - timedelta(minutes=65), 99, 9),  # 11:29 in 11:25
        (MINUTE - timedelta(minutes=5), 30, 2),
        (MINUTE, 12, 3),
    ]
    assert samples.series(queue, "week", now=NOW) == hour  # a bad range is the hour


def test_recent_pending_reads_a_whole_page_in_one_query():
    queues = [builders.queue(name=f"q{i}") for i in range(3)]
    _samples_at(queues[0], (MINUTE - timedelta(minutes=1), 5, 0), (MINUTE, 6, 0))
    _samples_at(queues[1], (MINUTE - timedelta(hours=2), 5, 0))
    with CaptureQueriesContext(connection) as ctx:
        found = samples.recent_pending([q.pk for q in queues], now=NOW)
    assert len(ctx) == 1
    assert found == {
        queues[0].pk: [(MINUTE - timedelta(minutes=1), 5), (MINUTE, 6)],
        queues[1].pk: [],
        queues[2].pk: [],
    }


def test_the_default_queue_is_sampled_like_a_plain_queue():
    """Its samples have no queue (it has no row); the console's list draws its sparkline."""
    _jobs("", 3)
    _jobs("", 1, state="running")
    builders.daemon(queues=[], state="busy")
    builders.daemon(queues=["other"], state="idle")  # not the default queue's
    assert samples.record(now=NOW) == 1
    sample = QueueSample.objects.get(queue=None, at=MINUTE)
    assert _row(sample) == {
        "pending": 3, "running": 1, "daemons": 1, "busy": 1, "desired": 1, "utilization": 1.0,
    }  # fmt: skip
    assert samples.record(now=NOW + timedelta(seconds=20)) == 0  # once a minute
    assert samples.recent_pending([None], now=NOW + timedelta(minutes=1)) == {None: [(MINUTE, 3)]}
