"""An idle daemon's poll asks the database for work only when something may have been
queued since a poll of this process last found its queues empty (jobs/wakeup.
note_empty and known_empty: every queued row notifies its queue). These tests take the
ways that could lose a job: a row queued after the look but heard before the note, a
notification not yet heard when the next poll starts, and a listener that lost its
connection (notifications missed)."""

import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from jobs import services, wakeup
from jobs.transitions import claim
from tests.jobs.test_long_poll import Claimer
from tests.support import builders

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "lakeshore.functions.echo"
listener = wakeup.listener


class Poll(Claimer):
    """A Claimer (its queries: the claim's own) that says how long the claim took and
    answers the ids it claimed."""

    def run(self):
        started = time.monotonic()
        super().run()
        self.took = time.monotonic() - started

    def result(self):
        return [i.pk for i in super().result()]


def _poll(daemon, wait):
    poll = Poll(daemon, wait)
    poll.start()
    return poll.result(), poll


def _until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def _idle_daemon(queue):
    builders.queue(name=queue)
    # its heartbeat fresh: an idle poll that has nothing of its own to write
    return builders.daemon(queues=[queue], last_heartbeat_at=timezone.now())


def _heard(queue):
    return listener.snapshot([queue])[0]


def test_an_idle_poll_after_an_empty_one_sends_no_query_until_work_is_queued():
    daemon = _idle_daemon("ke-idle")
    assert _poll(daemon, 0.3)[0] == []
    first = _poll(daemon, 0.3)[1]
    assert first.claimed == [] and first.queries == 0  # known empty: not asked again

    before = _heard("ke-idle")
    inv, _ = services.invocation_submit(function=ECHO, queue="ke-idle")
    _until(lambda: _heard("ke-idle") != before)  # this process heard of it
    got, poll = _poll(daemon, 30)
    assert got == [inv.pk]
    assert poll.took < 15  # looked at once: not after its 30 s wait
    assert poll.queries >= 1


def test_a_row_queued_after_the_look_but_heard_before_the_note_is_not_forgotten():
    """The mark is taken before the look: a row committed after the look moves its queue
    past the mark, so the note no longer holds (negative control: a mark taken after
    the notification was heard would say empty with the row there)."""
    builders.queue(name="ke-gap")
    mark = listener.empty_mark(["ke-gap"])
    assert not claim.any_queued(["ke-gap"])  # the look: nothing
    before = _heard("ke-gap")
    services.invocation_submit(function=ECHO, queue="ke-gap")
    _until(lambda: _heard("ke-gap") != before)
    listener.note_empty(["ke-gap"], mark)
    assert not listener.known_empty(["ke-gap"])

    listener.note_empty(["ke-gap"], listener.empty_mark(["ke-gap"]))  # the wrong order
    assert listener.known_empty(["ke-gap"])  # what the test above would catch


def test_a_submit_not_yet_heard_when_the_next_poll_starts_wakes_it(monkeypatch):
    """Forced: the listener hears nothing while a job is submitted and the next poll
    starts (it trusts the note and waits); the notification, heard then, wakes it."""
    daemon = _idle_daemon("ke-late")
    assert _poll(daemon, 0.3)[0] == []
    held = threading.Event()
    release = threading.Event()
    receive = listener._receive

    def late(payload):
        held.set()
        release.wait(20)
        receive(payload)

    monkeypatch.setattr(listener, "_receive", late)
    inv, _ = services.invocation_submit(function=ECHO, queue="ke-late")
    assert held.wait(30)  # its notification arrived, and is not heard yet
    poll = Poll(daemon, 30)
    poll.start()
    time.sleep(0.5)
    assert poll.is_alive()  # nothing heard: it trusted the note and waits
    released = time.monotonic()
    release.set()
    assert poll.result() == [inv.pk]
    assert time.monotonic() - released < 15  # woken by the notification, not its wait's end


def test_a_listener_that_lost_its_connection_forgets_what_it_knew_empty():
    daemon = _idle_daemon("ke-lost")
    assert _poll(daemon, 0.3)[0] == []
    assert listener.known_empty(["ke-lost"])
    stale = listener.empty_mark(["ke-lost"])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
        )
        assert cursor.fetchall(), "no listening connection to end"
    _until(lambda: not listener.known_empty(["ke-lost"]))
    _until(lambda: listener.healthy)
    listener.note_empty(["ke-lost"], stale)  # a look that began before the loss
    assert not listener.known_empty(["ke-lost"])
    # negative control: a look begun after it is kept again
    assert _poll(daemon, 0.3)[0] == []
    assert listener.known_empty(["ke-lost"])
