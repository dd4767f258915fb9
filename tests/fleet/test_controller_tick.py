"""The tick over every queue (fleet/controller.py): its statements do not grow with
the number of queues, a queue whose decision did not change writes nothing beyond its
sample, the scale-down window still holds across such a quiet stretch, and a queue
another tick holds is left to it."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import controller, tasks
from fleet.drivers import SimulatedDriver
from fleet.models import OVERLAP_NAMES_MAX, Daemon
from jobs import services as jobs
from jobs.models import Invocation
from lakeshore_admin import hooks
from lakeshore_admin.celery import app as celery_app
from queues import samples
from queues.models import Queue, QueueEvent, QueueSample
from tests.support import builders

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim():
    return builders.provider(name="sim", kind="simulated")


def _steady_queues(first: int, last: int, size: int = 2) -> None:
    """Queues s<first>…s<last - 1>, each with `size` fixed and that many idle daemons of
    its provider: nothing to launch or terminate."""
    for i in range(first, last):
        name = f"s{i}"
        builders.queue(name=name, provider="sim", elasticity_spec={"kind": "fixed", "min": size})
        for _ in range(size):
            builders.daemon(
                queues=[name], provider=Queue.objects.get(name=name).provider,
                last_heartbeat_at=timezone.now(),
            )  # fmt: skip


def _statements(call) -> int:
    with CaptureQueriesContext(connection) as ctx:
        call()
    return len(ctx)


def test_a_ticks_statements_do_not_grow_with_the_number_of_queues(sim):
    start = timezone.now()
    _steady_queues(0, 3)
    controller.tick(now=start)  # the first decisions are written
    events = QueueEvent.objects.count()
    at_3 = _statements(lambda: controller.tick(now=start + timedelta(minutes=1)))
    assert QueueEvent.objects.count() == events  # steady: no event…
    assert QueueSample.objects.filter(at__gte=start + timedelta(seconds=1)).count() == 4
    # …only the samples (3 queues and the default queue's)

    _steady_queues(3, 30)
    controller.tick(now=start + timedelta(minutes=2))
    events = QueueEvent.objects.count()
    at_30 = _statements(lambda: controller.tick(now=start + timedelta(minutes=3)))
    assert QueueEvent.objects.count() == events
    assert at_30 == at_3, (at_3, at_30)


def test_negative_control_a_tick_per_queue_grows_with_the_queues(sim):
    """The same steady queues ticked one by one (tick_queue: a wake's decision): the count
    the test above compares does see the growth."""
    _steady_queues(0, 3)
    ids = list(Queue.objects.values_list("pk", flat=True))
    at_3 = _statements(lambda: [builders.tick_queue(pk) for pk in ids])
    _steady_queues(3, 30)
    ids = list(Queue.objects.values_list("pk", flat=True))
    at_30 = _statements(lambda: [builders.tick_queue(pk) for pk in ids])
    assert at_30 > at_3 * 5


def test_a_quiet_queue_writes_no_event_and_a_change_writes_one(sim):
    start = timezone.now()
    _steady_queues(0, 1)
    controller.tick(now=start)
    [first] = QueueEvent.objects.all()
    assert (first.action, first.daemons, first.desired) == ("tick_noop", 2, 2)
    for seconds in (10, 20, 30):
        report = controller.tick(now=start + timedelta(seconds=seconds))
        assert report["queues"] == 1  # decided for, and nothing to say
    assert QueueEvent.objects.count() == 1
    Invocation.objects.create(queue="s0", function="x.y")  # P: 0 → 1
    controller.tick(now=start + timedelta(seconds=40))
    latest = QueueEvent.objects.order_by("-id").first()
    assert (QueueEvent.objects.count(), latest.action, latest.pending) == (2, "tick_noop", 1)


def test_the_scale_down_window_holds_what_a_quiet_stretch_wanted(sim, settings):
    """The backlog wanted 3 daemons, then nothing changed for a long time (no event was
    written), then the backlog went away: the queue still wanted 3 within the window,
    so it holds them, though no event lies inside the window."""
    settings.LAKESHORE_STARTUP_GRACE = 0
    settings.LAKESHORE_SCALE_DOWN_WINDOW = 300
    builders.queue(
        name="train", provider="sim", elasticity_spec={"kind": "fully_elastic", "max": 10}
    )
    Invocation.objects.bulk_create([Invocation(queue="train", function="x.y") for _ in range(3)])
    start = timezone.now()
    for seconds in range(0, 1000, 100):  # up, idle, then a quiet stretch
        controller.tick(now=start + timedelta(seconds=seconds))
    assert QueueEvent.objects.count() == 2  # scale_up 3, then D = 3: nothing after
    Invocation.objects.all().delete()
    now = start + timedelta(seconds=1000)
    assert not QueueEvent.objects.filter(at__gt=now - timedelta(seconds=300)).exists()

    controller.tick(now=now)

    held = QueueEvent.objects.order_by("-id").first()
    assert (held.action, held.wanted, held.desired) == ("tick_noop", 0, 3)
    assert "holding 3 for the scale-down window" in held.reason
    assert Daemon.objects.live().subscribed_to("train").count() == 3

    settings.LAKESHORE_SCALE_DOWN_WINDOW = 0  # control: no window, no hold
    controller.tick(now=now + timedelta(seconds=10))
    down = QueueEvent.objects.order_by("-id").first()
    assert (down.action, down.delta) == ("scale_down", -2)


# ---------------------------------------------------------------------------- locks


@pytest.fixture
def held_launch(monkeypatch):
    """A launch made outside the main thread stops inside the tick's transaction (its
    queue's lock held) until `release` is set."""
    inside, release = threading.Event(), threading.Event()
    launch = SimulatedDriver.launch

    def held(self, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            inside.set()
            release.wait(20)
        return launch(self, **kwargs)

    monkeypatch.setattr(SimulatedDriver, "launch", held)
    return inside, release


def _tick_while_a_queue_tick_launches(held_launch) -> tuple[dict, Queue, Queue]:
    inside, release = held_launch
    fixed = {"kind": "fixed", "min": 2}
    busy = builders.queue(name="busy", provider="sim", elasticity_spec=fixed)
    other = builders.queue(name="other", provider="sim", elasticity_spec=fixed)

    def run():
        try:
            builders.tick_queue(busy.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    assert inside.wait(20)
    try:
        report = controller.tick()
    finally:
        release.set()
        thread.join(30)
    return report, busy, other


@pytest.mark.django_db(transaction=True)
def test_a_tick_leaves_a_queue_another_tick_holds_to_it(sim, held_launch):
    report, busy, other = _tick_while_a_queue_tick_launches(held_launch)

    assert (report["queues"], report["skipped"]) == (1, 1)
    assert Daemon.objects.subscribed_to("busy").count() == 2  # launched once
    assert list(busy.events.values_list("action", "delta")) == [("scale_up", 2)]
    assert Daemon.objects.subscribed_to("other").count() == 2  # the tick went on


@pytest.mark.django_db(transaction=True)
def test_negative_control_without_the_locks_the_tick_launches_again(sim, held_launch, monkeypatch):
    monkeypatch.setattr(controller, "try_lock", lambda ids: set(ids))
    _, busy, _ = _tick_while_a_queue_tick_launches(held_launch)

    assert Daemon.objects.subscribed_to("busy").count() == 4


def test_many_queue_names_find_the_same_daemons_as_a_few():
    """Past OVERLAP_NAMES_MAX names, subscribed_to_any looks each daemon's names up in a
    hashed set instead of the array overlap: the same daemons either way."""
    names = [f"n{i}" for i in range(OVERLAP_NAMES_MAX + 6)]
    for i, name in enumerate(names):
        builders.daemon(queues=[name, "other"] if i % 2 else [name])
    builders.daemon(queues=["other"])
    builders.daemon(queues=[])
    many = set(Daemon.objects.subscribed_to_any(names).values_list("pk", flat=True))
    few = set()
    for start in range(0, len(names), 10):
        chunk = names[start : start + 10]
        few |= set(Daemon.objects.subscribed_to_any(chunk).values_list("pk", flat=True))
    assert many == few and len(many) == len(names)
    assert samples.live_daemons(names) == {name: {"idle": 1} for name in names}


# ---------------------------------------------------------------------------- wakes


@pytest.fixture
def no_broker(monkeypatch):
    """The wakes submits send go nowhere (the broker is the boundary): the test wakes."""
    monkeypatch.setattr(tasks, "_sent", {})
    monkeypatch.setattr(celery_app, "send_task", lambda *args, **kwargs: None)


def _tick_with_a_submit_meanwhile() -> list:
    """A tick, during which (its signals read, its queues held) a job is submitted into
    `train` and the controller woken for it, as the submit's wake does."""
    woken: list = []

    def submit_meanwhile():
        if woken:
            return  # once: the wake's own tick passes here too

        def run():
            try:
                jobs.invocation_submit(function="lakeshore.functions.echo", queue="train")
                woken.append(controller.wake("train"))
            finally:
                connection.close()

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(30)

    hooks.register("tick.acted", submit_meanwhile)
    try:
        controller.tick()
    finally:
        hooks.clear("tick.acted")
    return woken


@pytest.mark.django_db(transaction=True)
def test_a_wake_that_finds_the_queue_held_by_the_tick_is_not_lost(sim, no_broker):
    builders.queue(
        name="train", provider="sim", elasticity_spec={"kind": "fully_elastic", "max": 4}
    )
    assert _tick_with_a_submit_meanwhile() == [None]  # the tick held the queue

    assert Daemon.objects.live().subscribed_to("train").count() == 1
    [up] = QueueEvent.objects.filter(action="scale_up")
    assert up.reason.startswith("woken by a submit: ") and up.delta == 1


@pytest.mark.django_db(transaction=True)
def test_negative_control_without_the_tick_waking_it_the_submit_waits(sim, no_broker, monkeypatch):
    monkeypatch.setattr(controller, "_missed_wakes", lambda events: [])
    builders.queue(
        name="train", provider="sim", elasticity_spec={"kind": "fully_elastic", "max": 4}
    )
    assert _tick_with_a_submit_meanwhile() == [None]

    assert not Daemon.objects.live().subscribed_to("train").exists()  # until the next tick
