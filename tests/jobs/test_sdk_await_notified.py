"""The SDK's await waits on the listening connection (jobs/wakeup.py): an SDK
invocation's end is notified (`inv:ID`, jobs/migrations/0012), so a waiting await
answers at once and looks at the invocation only every few seconds meanwhile (LOOK_SDK,
a safety net: pushed out of the way here, so that only the notification can answer it
early). The control: an invocation of the REST API, whose end nothing notifies, is
looked at again and again (a growing pause of 20 ms to 250 ms)."""

import threading
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs import sdk, services, waits, wakeup
from jobs.models import Invocation
from jobs.wakeup import listener
from tests.support import builders

pytestmark = pytest.mark.django_db(transaction=True)


AWAIT = 20.0  # seconds each await may wait: its end comes 1 or 1.5 s in


def _await_ending_at(pk: int, ends_after: float) -> tuple[dict, float, int]:
    """Await `pk` (up to AWAIT s) in a thread; end it `ends_after` s later with a bare
    UPDATE. (its answer, seconds from the end to the answer, its looks)."""
    got = {}

    def awaiting():
        with CaptureQueriesContext(connection) as ctx:
            steps = sdk.await_steps({"invocation_id": str(pk), "timeout_s": AWAIT})
            got["answer"] = waits.drive(steps)
        got["at"] = time.monotonic()
        got["looks"] = sum(1 for q in ctx.captured_queries if "jobs_invocation" in q["sql"])
        connection.close()

    thread = threading.Thread(target=awaiting)
    thread.start()
    time.sleep(ends_after)
    Invocation.objects.filter(pk=pk).update(state="succeeded", result_blob=b"\x01")
    ended = time.monotonic()
    thread.join(2 * AWAIT)
    return got["answer"], got["at"] - ended, got["looks"]


def test_an_sdk_await_wakes_at_its_end_and_hardly_looks_meanwhile(monkeypatch):
    monkeypatch.setattr(sdk, "LOOK_SDK", 2 * AWAIT)  # no look but the first before its end
    _until(lambda: listener.healthy)
    builders.queue(name="w")
    job = services.invocation_submit(function="f", queue="w", wire="value", args_blob=b"x")[0]
    answer, late, looks = _await_ending_at(job.pk, 1.0)
    assert answer["state"] == "succeeded" and answer["result_blob"] == b"\x01"
    assert late < AWAIT / 2  # woken: unwoken, it would answer at its wait's end, 19 s on
    assert looks <= 2  # the first look, and the one its end woke


def test_control_a_rest_invocations_await_looks_again_and_again():
    builders.queue(name="w")
    job = services.invocation_submit(function="lakeshore.functions.echo", queue="w")[0]
    answer, late, looks = _await_ending_at(job.pk, 1.5)
    assert answer["state"] == "succeeded"
    assert late < AWAIT / 4  # found by one of its looks, not at its wait's end
    assert looks >= 6


def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_one_off_names_are_kept_only_while_waited_on(monkeypatch):
    """Nothing unbounded: a notification of an invocation nobody waits on adds nothing,
    and a name nobody has waited on for FORGET_AFTER is forgotten (by the listening
    thread, within a turn of a second), while one still waited on is kept."""
    monkeypatch.setattr(wakeup, "FORGET_AFTER", 0.5)
    _until(lambda: listener.healthy)
    _until(lambda: listener.one_offs() == 0, timeout=30.0)  # earlier tests' names
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify('lakeshore_work', 'inv:987654321')")
    time.sleep(0.3)
    assert listener.one_offs() == 0  # nobody waits on it
    listener.snapshot(["inv:111111111", "frame:gone-topic"])
    assert listener.one_offs() == 2
    # waited on until its notification below (60 s at most)
    kept = threading.Thread(target=listener.wait, args=(["frame:kept"], (0,), 60.0))
    kept.start()
    time.sleep(0.2)
    assert listener.one_offs() == 3
    _until(lambda: listener.one_offs() == 1, timeout=30.0)  # the two are forgotten
    time.sleep(1.5)
    assert listener.one_offs() == 1  # the one waited on (past FORGET_AFTER) is not
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify('lakeshore_work', 'frame:kept')")
    kept.join(30)
    assert not kept.is_alive()
    _until(lambda: listener.one_offs() == 0, timeout=30.0)  # nor once its wait is over


def test_one_off_names_have_a_bound(monkeypatch):
    """Past ONE_OFF_MAX names a new one is not followed (an await of it finds its end by
    its own looks); the names already followed still are."""
    monkeypatch.setattr(wakeup, "ONE_OFF_MAX", 2)
    monkeypatch.setattr(wakeup, "FORGET_AFTER", 0.5)
    _until(lambda: listener.healthy)
    _until(lambda: listener.one_offs() == 0, timeout=30.0)  # earlier tests' names
    listener.snapshot(["inv:1", "inv:2", "inv:3"])
    assert listener.one_offs() == 2
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify('lakeshore_work', 'inv:3')")
        cursor.execute("SELECT pg_notify('lakeshore_work', 'inv:2')")
    _until(lambda: listener.snapshot(["inv:2"]) == (1,))
    assert listener.snapshot(["inv:3"]) == (0,) and listener.one_offs() == 2
