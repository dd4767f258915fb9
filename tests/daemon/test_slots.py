"""The daemon's slots on their own (lakeshore.worker.slots), with a real reporter and log
shipper that are never started: what a claim may ask for, what the daemon holds (what a
heartbeat names) from a claim's answer until its outcome is answered, and what an
operator's order lets go of. No server, no job process."""

import threading
import time

from lakeshore.joblog import LogBook
from lakeshore.worker import slots as slots_module
from lakeshore.worker.logs import Shipper
from lakeshore.worker.reporting import Reporter
from lakeshore.worker.slots import CLAIM_LIMIT_MAX, Slots
from lakeshore.worker.stopping import Stopping


def _job(n: int) -> dict:
    return {"id": n, "attempts": 1, "function": "f", "args": [], "kwargs": {}}


def _slots(concurrency: int) -> tuple[Slots, Reporter, Stopping]:
    sent: list = []
    reporter = Reporter(sent.append, lambda: None)
    shipper = Shipper(LogBook(), lambda *args, **kwargs: None, ready=reporter.mark_ready, log=print)
    stopping = Stopping()
    slots = Slots(concurrency, stopping=stopping, reporter=reporter, shipper=shipper, log=print)
    return slots, reporter, stopping


def _held(slots: Slots, n: int):
    return next(item for item in slots.not_in(set()) if item.id == str(n))


def test_a_claim_asks_for_the_free_slots_and_its_answer_holds_what_came():
    slots, reporter, stopping = _slots(3)
    assert slots.reserve() == (3, False)
    slots.claimed(3, [_job(1)], "7")
    assert slots.held_ids() == {1}
    assert slots.reserve() == (2, True)  # one slot is taken by what came


def test_an_ended_invocation_is_held_until_the_server_answered_its_outcome():
    slots, reporter, stopping = _slots(1)
    slots.reserve()
    slots.claimed(1, [_job(1)], "7")

    slots.end(_held(slots, 1), "succeeded", {"n": 1}, "")

    assert slots.held_ids() == {1}  # a heartbeat still names it: it waits to be reported
    assert not slots.idle()
    batch = reporter.take("7")
    assert [(o.item.id, o.state, o.result) for o in batch] == [("1", "succeeded", {"n": 1})]
    reporter.finished(batch)
    assert slots.held_ids() == set()
    assert slots.idle()


def test_while_jobs_are_short_a_claim_asks_ahead_of_the_free_slots():
    slots, reporter, stopping = _slots(1)
    assert slots.reserve() == (1, False)
    slots.claimed(1, [_job(1)], "7")
    slots.end(_held(slots, 1), "succeeded", None, "")  # it ran for no time at all

    free, busy = slots.reserve()

    assert free == CLAIM_LIMIT_MAX  # many more than the one slot: they go by fast


def test_an_operators_order_lets_go_of_an_invocation_and_its_outcome_is_not_reported():
    slots, reporter, stopping = _slots(1)
    slots.reserve()
    slots.claimed(1, [_job(1)], "7")

    item = slots.let_go("1", grace=10)

    assert item is not None and item.abandoned
    assert slots.let_go("2", grace=10) is None  # not held here
    slots.end(item, "failed", None, "killed")
    assert slots.held_ids() == set()
    assert reporter.pending() == 0


def test_a_claim_asks_for_nothing_once_the_daemon_drains():
    slots, reporter, stopping = _slots(2)
    stopping.draining.set()
    assert slots.reserve() == (0, False)


def _reserve_in_a_thread(slots: Slots) -> tuple[threading.Thread, list]:
    got: list = []
    thread = threading.Thread(target=lambda: got.append(slots.reserve()), daemon=True)
    thread.start()
    return thread, got


def _end_now(slots: Slots, n: int) -> None:
    item = _held(slots, n)
    item.started = time.monotonic()  # it ran for no time: jobs stay short
    slots.end(item, "succeeded", None, "")


def test_while_every_slot_has_its_next_job_a_claim_waits_for_half_the_room(monkeypatch):
    """A claim of the few that just freed would cost a request every few jobs."""
    monkeypatch.setattr(slots_module, "BATCH_WAIT", 30.0)  # here: until the room is there
    slots, reporter, stopping = _slots(2)
    slots.run_average = 0.0005  # short jobs: the room is 2 slots + 100 ahead
    assert slots.reserve() == (CLAIM_LIMIT_MAX, False)
    slots.claimed(CLAIM_LIMIT_MAX, [_job(n) for n in range(1, 101)], "7")

    thread, got = _reserve_in_a_thread(slots)
    thread.join(0.3)
    assert thread.is_alive() and got == []  # 2 free of 102, every slot has work waiting
    for n in range(1, 50):
        _end_now(slots, n)
    thread.join(5)
    assert got == [(51, True)]  # half the room


def test_a_claim_waits_for_no_batch_while_a_slot_would_have_nothing_next(monkeypatch):
    monkeypatch.setattr(slots_module, "BATCH_WAIT", 30.0)
    slots, reporter, stopping = _slots(8)
    slots.run_average = 0.05  # the room: 8 slots + 8 ahead; half of it is 8
    assert slots.reserve() == (16, False)
    slots.claimed(16, [_job(n) for n in range(1, 17)], "7")
    assert len(slots._startable()) == 8  # the spawner starts 8: 8 wait, one a slot
    _end_now(slots, 1)
    slots.run_average = 0.05  # as before that end: 1 free of the 16

    thread, got = _reserve_in_a_thread(slots)
    thread.join(0.3)
    assert thread.is_alive() and got == []  # the control: each slot has its next job

    assert len(slots._startable()) == 1  # a slot takes its next: one slot has none after it
    slots.wake()
    thread.join(5)
    assert got == [(1, True)]  # asked for at once, without the batch
