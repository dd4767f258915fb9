"""Ticks of one queue racing each other: every round has work to do (the fixed size goes
up each round), and after every round exactly that work was done, once."""

import threading

import pytest
from django.db import connection

from fleet import controller
from fleet.drivers import SimulatedDriver
from fleet.models import Daemon
from queues.models import Queue, QueueEvent
from tests.support import builders

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 10
STEP = 2  # daemons each round adds to the fixed size (≤ LAKESHORE_MAX_LAUNCH_PER_TICK)
TICKERS = 4


class _LaunchGate:
    """Holds a tick inside its launch (transaction open, queue lock held) until every
    other tick of the round has either returned or reached a launch too, so the others
    always race a launch in progress rather than one already committed."""

    def __init__(self, parties: int):
        self._cond = threading.Condition()
        self._parties = parties
        self._settled: set[int] = set()
        self.launching = 0

    def settle(self) -> None:
        with self._cond:
            self._settled.add(threading.get_ident())
            self._cond.notify_all()

    def hold(self) -> None:
        with self._cond:
            self.launching += 1
        self.settle()
        with self._cond:
            self._cond.wait_for(lambda: len(self._settled) >= self._parties, timeout=30)


@pytest.fixture
def gate(monkeypatch):
    """The current round's gate (None: launches run free)."""
    current: dict[str, _LaunchGate | None] = {"gate": None}
    launch = SimulatedDriver.launch

    def held_launch(self, **kwargs):
        if current["gate"] is not None:
            current["gate"].hold()
        return launch(self, **kwargs)

    monkeypatch.setattr(SimulatedDriver, "launch", held_launch)
    return current


def _round(queue_id: int, gate: _LaunchGate | None = None) -> list[QueueEvent | None]:
    """TICKERS ticks of the queue at once; what each returned."""
    barrier = threading.Barrier(TICKERS)
    results: list[QueueEvent | None] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def tick():
        try:
            barrier.wait()
            result = builders.tick_queue(queue_id)
            with lock:
                results.append(result)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            with lock:
                errors.append(exc)
        finally:
            if gate is not None:
                gate.settle()
            connection.close()

    threads = [threading.Thread(target=tick) for _ in range(TICKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a tick never finished"
    assert not errors, errors
    return results


def _sim_queue() -> Queue:
    provider = builders.provider(name="sim", kind="simulated")
    return builders.queue(
        name="train", provider=provider.name, elasticity_spec={"kind": "fixed", "min": STEP}
    )


def _launched(queue: Queue) -> int:
    return Daemon.objects.filter(provider__name="sim").subscribed_to(queue.name).count()


def _assert_round(queue: Queue, results, size: int, events_before: int) -> None:
    """After a round that raised the size to `size`: exactly STEP launched by exactly one
    tick, every other tick skipped or found nothing to do, and the deltas add up."""
    assert _launched(queue) == size  # no double launch, none missing
    assert Daemon.objects.live().subscribed_to(queue.name).count() == size
    decided = [r for r in results if r is not None]
    assert len(results) == TICKERS and decided, results
    new = list(QueueEvent.objects.filter(queue=queue).order_by("id")[events_before:])
    assert sorted(e.pk for e in new) == sorted(e.pk for e in decided)  # one per decision
    scale_ups = [e for e in new if e.action == "scale_up"]
    assert [(e.delta, e.daemons, e.wanted) for e in scale_ups] == [(STEP, size - STEP, size)]
    assert all(e.delta == 0 for e in new if e.action != "scale_up"), [
        (e.action, e.delta) for e in new
    ]
    deltas = QueueEvent.objects.filter(queue=queue).values_list("delta", flat=True)
    assert sum(deltas) == size


def test_two_ticks_at_once_never_launch_twice(gate):
    """Free-running rounds: a tick may find the queue locked, or arrive after the launch
    committed and find the pool at its size; either way, one launch per round."""
    queue = _sim_queue()
    for n in range(1, ROUNDS + 1):
        size = n * STEP
        Queue.objects.filter(pk=queue.pk).update(elasticity_min=size)
        events_before = QueueEvent.objects.filter(queue=queue).count()
        results = _round(queue.pk)
        _assert_round(queue, results, size, events_before)
    assert QueueEvent.objects.filter(queue=queue, action="scale_up").count() == ROUNDS


def test_ticks_racing_a_launch_in_progress_skip_the_queue(gate):
    """Every round, the tick that launches is held inside its launch until the other
    three have run: each finds the queue held and does nothing (None, no event)."""
    queue = _sim_queue()
    for n in range(1, ROUNDS + 1):
        size = n * STEP
        Queue.objects.filter(pk=queue.pk).update(elasticity_min=size)
        events_before = QueueEvent.objects.filter(queue=queue).count()
        gate["gate"] = round_gate = _LaunchGate(TICKERS)
        results = _round(queue.pk, round_gate)
        assert round_gate.launching == 1
        assert results.count(None) == TICKERS - 1, results
        _assert_round(queue, results, size, events_before)


def test_the_race_check_sees_ticks_that_do_not_lock_the_queue(gate, monkeypatch):
    """Negative control: without the queue lock, the same round launches once per tick,
    and the round's check fails."""
    monkeypatch.setattr(controller, "try_lock", lambda queue_ids: set(queue_ids))
    queue = _sim_queue()
    gate["gate"] = round_gate = _LaunchGate(TICKERS)
    results = _round(queue.pk, round_gate)
    assert round_gate.launching == TICKERS
    assert _launched(queue) == TICKERS * STEP
    with pytest.raises(AssertionError):
        _assert_round(queue, results, STEP, 0)
