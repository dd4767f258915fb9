"""Waiting daemons cost nothing: a long-poll claim sleeps on LISTEN/NOTIFY, holds no
database connection while it waits, does not rewrite its daemon's row, and wakes for
every way work can appear (submit, requeue, resume, the end of a retry's back-off)."""

import threading
import time
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import daemons, protocol
from fleet.models import Daemon
from jobs import services, waits, wakeup
from jobs.models import Invocation
from jobs.wakeup import listener
from lakeshore_admin import hooks
from queues.services import queue_transition
from tests.support import builders

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "lakeshore.functions.echo"


class Claimer(threading.Thread):
    """A long-poll claim on its own thread (and connection), counting its queries."""

    def __init__(self, daemon, wait):
        super().__init__()
        self.daemon, self.wait = daemon, wait
        self.claimed = None
        self.queries = None
        self.error = None

    def run(self):
        try:
            with CaptureQueriesContext(connection) as ctx:
                self.claimed = builders.claim(
                    daemon=Daemon.objects.get(pk=self.daemon.pk), wait=self.wait
                )
            self.queries = len(ctx.captured_queries) - 1  # minus the daemon lookup above
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            self.error = exc
        finally:
            connection.close()

    def result(self):
        self.join(60)
        assert not self.is_alive(), "the claim never returned"
        assert self.error is None, self.error
        return self.claimed


def _connections_in_use() -> int:
    """Connections this process's threads hold now: lent out by the pool (an idle pooled
    connection is held by nobody), or, without a pool, every open one but the shared
    listener's."""
    pool = getattr(connection, "pool", None)
    if pool is not None:
        stats = pool.get_stats()
        return stats["pool_size"] - stats["pool_available"]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) - 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend'"
        )
        return cursor.fetchone()[0]


def _until(condition, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.mark.slow
def test_an_empty_20_second_wait_costs_less_than_an_empty_instant_claim():
    builders.queue(name="idle")
    daemon = builders.daemon(queues=["idle"])
    builders.claim(daemon=daemon)  # this process now knows the queue's kind
    instant = Claimer(daemon, wait=0)
    instant.start()
    assert instant.result() == []
    row_before = Daemon.objects.values("updated_at", "last_heartbeat_at").get(pk=daemon.pk)

    in_use_before = _connections_in_use()  # this test thread's own (and any other's)
    waiting = Claimer(daemon, wait=20)
    waiting.start()
    time.sleep(2)  # well into its wait
    in_use_while_waiting = _connections_in_use()
    assert waiting.result() == []

    # a long-poll first asks whether anything is queued (one indexed read): with nothing,
    # it waits without the claim's transaction, so it costs less than an instant claim
    assert waiting.queries == 1 < instant.queries
    assert in_use_while_waiting <= in_use_before  # the waiting claim holds none
    row_after = Daemon.objects.values("updated_at", "last_heartbeat_at").get(pk=daemon.pk)
    # the wait wrote nothing of its own; its process renewed the parked daemon's heartbeat
    # (one statement a turn for all its parked daemons: fleet/parked.py)
    assert row_after["updated_at"] == row_before["updated_at"]
    assert row_after["last_heartbeat_at"] > row_before["last_heartbeat_at"]


def test_a_waiting_claim_wakes_for_a_submit():
    builders.queue(name="w")
    claimer = Claimer(builders.daemon(queues=["w"]), wait=15)
    claimer.start()
    time.sleep(0.5)  # it looked, found nothing, and sleeps
    inv, _ = services.invocation_submit(function=ECHO, queue="w")
    # At its deadline an empty claim answers [] without looking again: getting the
    # invocation means the submit woke it.
    assert [i.pk for i in claimer.result()] == [inv.pk]


def test_a_waiting_claim_wakes_when_a_failed_attempt_is_requeued(settings):
    settings.LAKESHORE_RETRY_BACKOFF = 0
    builders.queue(name="w")
    inv, _ = services.invocation_submit(function=ECHO, queue="w", max_attempts=2)
    first = builders.daemon(queues=["w"])
    builders.claim(daemon=first)
    claimer = Claimer(builders.daemon(queues=["w"]), wait=15)
    claimer.start()
    time.sleep(0.5)
    protocol.invocation_complete(
        daemon=first, invocation_id=inv.pk, attempt=1, outcome="failed", error="x"
    )
    got = claimer.result()
    assert [(i.pk, i.attempts) for i in got] == [(inv.pk, 2)]


def test_a_waiting_claim_wakes_when_its_retry_back_off_ends(settings):
    settings.LAKESHORE_RETRY_BACKOFF = 1.5
    builders.queue(name="w")
    inv, _ = services.invocation_submit(function=ECHO, queue="w", max_attempts=2)
    first = builders.daemon(queues=["w"])
    builders.claim(daemon=first)
    protocol.invocation_complete(
        daemon=first, invocation_id=inv.pk, attempt=1, outcome="failed", error="x"
    )
    due = Invocation.objects.get(pk=inv.pk).scheduled_at
    claimer = Claimer(builders.daemon(queues=["w"]), wait=15)
    claimer.start()
    assert [i.pk for i in claimer.result()] == [inv.pk]  # woken when its time came
    inv.refresh_from_db()
    assert inv.started_at >= due  # and not before


def test_a_waiting_claim_wakes_when_its_paused_queue_resumes():
    builders.queue(name="w")
    queue_transition(name="w", action="pause")
    inv, _ = services.invocation_submit(function=ECHO, queue="w")
    claimer = Claimer(builders.daemon(queues=["w"]), wait=15)
    claimer.start()
    time.sleep(0.5)
    assert claimer.is_alive()  # paused: it waits
    queue_transition(name="w", action="resume")
    assert [i.pk for i in claimer.result()] == [inv.pk]


def test_a_heartbeat_rewrites_the_daemon_row_at_most_every_few_seconds(settings):
    settings.LAKESHORE_HEARTBEAT_WRITE_SECONDS = 30
    builders.queue(name="w")
    daemon = builders.daemon(queues=["w"])
    daemons.daemon_heartbeat(daemon=daemon)  # the first one writes (no heartbeat yet)
    written = Daemon.objects.values_list("updated_at", flat=True).get(pk=daemon.pk)
    for _ in range(5):
        daemons.daemon_heartbeat(daemon=daemon)
    assert Daemon.objects.values_list("updated_at", flat=True).get(pk=daemon.pk) == written

    settings.LAKESHORE_HEARTBEAT_WRITE_SECONDS = 0  # negative control: every time
    daemons.daemon_heartbeat(daemon=daemon)
    assert Daemon.objects.values_list("updated_at", flat=True).get(pk=daemon.pk) > written


def test_busy_and_idle_are_written_at_once_whatever_the_heartbeat_interval(settings):
    """Busy with the claim that takes work; idle when it is done and nothing is queued
    for it. Between jobs of a backlog the daemon's row is not written at all."""
    settings.LAKESHORE_HEARTBEAT_WRITE_SECONDS = 30
    builders.queue(name="w")
    daemon = builders.daemon(queues=["w"])
    daemons.daemon_heartbeat(daemon=daemon)

    def seen():
        return (
            Daemon.objects.for_list()
            .values_list("state", "current_invocation_id", "updated_at")
            .get(pk=daemon.pk)
        )

    first, _ = services.invocation_submit(function=ECHO, queue="w")
    second, _ = services.invocation_submit(function=ECHO, queue="w")
    builders.claim(daemon=daemon)
    daemon.refresh_from_db()
    state, current, written = seen()
    assert (state, current) == ("busy", first.pk)
    protocol.invocation_complete(daemon=daemon, invocation_id=first.pk, attempt=1, result=1)
    assert seen() == ("busy", None, written)  # the second is queued: not written
    builders.claim(daemon=daemon)
    assert seen() == ("busy", second.pk, written)  # busy already: not written
    protocol.invocation_complete(daemon=daemon, invocation_id=second.pk, attempt=1, result=1)
    assert seen()[:2] == ("idle", None)


def test_released_waiters_answer_empty_at_once_without_another_query_and_later_waits_still_wait():
    builders.queue(name="idle")
    daemon = builders.daemon(queues=["idle"])
    builders.claim(daemon=daemon)
    for _ in range(2):  # what a wait that runs out costs, once its queue is known empty
        short = Claimer(daemon, wait=0.2)
        short.start()
        short.result()
    waiting = Claimer(daemon, wait=30)
    waiting.start()
    time.sleep(1)  # in its wait
    listener.release_waiters()
    waiting.join(10)
    assert not waiting.is_alive(), "a released wait kept waiting"
    assert waiting.result() == []
    assert waiting.queries == short.queries  # it looked nowhere after its release

    later = Claimer(daemon, wait=30)
    later.start()
    time.sleep(1)
    assert later.is_alive()  # a wait begun after the release is not cut short
    services.invocation_submit(function=ECHO, queue="idle")
    assert [inv.function for inv in later.result()] == [ECHO]


def test_a_waiting_claim_of_a_dropped_daemon_answers_at_once():
    """Its 409 comes at the drop, not when its 30 s wait is over: the daemon stops at
    once (negative control: without the drop's notification, this waits 30 s)."""
    builders.queue(name="w")
    daemon = builders.daemon(queues=["w"])
    claimer = Claimer(daemon, wait=30)
    claimer.start()
    time.sleep(0.5)  # it looked, found nothing, and sleeps
    dropped = time.monotonic()
    daemons.daemon_drop(daemon=Daemon.objects.get(pk=daemon.pk))
    claimer.join(60)
    took = time.monotonic() - dropped
    assert getattr(claimer.error, "code", None) == "daemon_terminated", claimer.error
    assert took < 15, took  # at the drop, well before its wait's end


def test_work_queued_between_the_look_and_the_wait_wakes_it():
    """A long-poll looks (nothing queued), then waits; a submit in between is not
    missed: the wait's snapshot was taken before the look. Forced: the submit runs in
    the gap (negative control: a snapshot taken after the look sleeps out the wait)."""
    builders.queue(name="gap")
    # its heartbeat is fresh: an idle long-poll that has nothing to rewrite
    daemon = builders.daemon(queues=["gap"], last_heartbeat_at=timezone.now())
    submitted = []

    def submit_in_the_gap():
        hooks.clear()  # once

        def submit():
            try:
                submitted.append(services.invocation_submit(function=ECHO, queue="gap")[0].pk)
            finally:
                connection.close()  # this thread's connection: back to the pool

        done = threading.Thread(target=submit)
        done.start()
        done.join(10)

    hooks.register("claim.probed_empty", submit_in_the_gap)
    try:
        claimer = Claimer(daemon, wait=30)
        started = time.monotonic()
        claimer.start()
        got = claimer.result()
    finally:
        hooks.clear()
    assert len(submitted) == 1  # the look found nothing, and the submit ran in the gap
    assert [i.pk for i in got] == submitted
    assert time.monotonic() - started < 15  # woken, well before its wait's end


def test_a_waiting_claim_of_a_removed_daemon_says_it_ended():
    """Its row deleted while it waited (`daemons rm`): daemon_terminated, not a 500."""
    builders.queue(name="w")
    daemon = builders.daemon(queues=["w"])
    claimer = Claimer(daemon, wait=1)
    claimer.start()
    time.sleep(0.3)
    Daemon.objects.filter(pk=daemon.pk).delete()
    services.invocation_submit(function="x.y", queue="w")  # wakes it: it looks again
    claimer.join(30)
    assert getattr(claimer.error, "code", None) == "daemon_terminated", claimer.error


def test_a_waiting_claim_of_a_daemon_asked_to_drain_answers_at_once():
    """The drain's notification (daemon:ID) wakes its claim, which answers empty at once
    through the daemon protocol (it says draining: tests/daemon/test_daemon.py); the
    control is a claim that does not tell a draining daemon, which waits its whole wait."""
    name = _own_queue()
    builders.queue(name=name)
    daemon = builders.daemon(queues=[name])
    answer = {}
    wait = 10

    def claim(tell: bool):
        row = Daemon.objects.get(pk=daemon.pk)
        steps = protocol.claim_steps(daemon=row, wait=wait, tell_draining=tell)
        started = time.monotonic()
        answer[tell] = (waits.drive(steps), started)
        connection.close()

    for tell in (True, False):
        Daemon.objects.filter(pk=daemon.pk).update(state="idle")
        thread = threading.Thread(target=claim, args=(tell,))
        thread.start()
        time.sleep(0.5)
        asked = time.monotonic()
        Daemon.objects.filter(pk=daemon.pk).update(state="draining")
        thread.join(30)
        answer[tell] = (answer[tell][0], time.monotonic() - asked)
    # told: at the drain; the control: at its wait's end, wait - 0.5 s after the drain
    assert answer[True][0] == [] and answer[True][1] < wait / 2
    assert answer[False][0] == [] and answer[False][1] >= wait / 2


def _own_queue() -> str:
    """A queue name no other test uses, for a control that must wait its whole wait: the
    listener outlives a test, and a retry's back-off an earlier test left due on a shared
    name ("w@epoch", tests/jobs/test_dispatch_races_reports.py) wakes that name's waiters when it
    ends, maybe in the middle of this test."""
    return f"own-{uuid.uuid4().hex[:12]}"


def _heard_bump(name: str, before: int, timeout: float = 10.0) -> None:
    """Until the listener has heard `name`'s notification (its version moved)."""
    _until(lambda: wakeup.listener.snapshot([name])[0] != before, timeout)


@pytest.mark.parametrize("told", [True, False])
def test_a_drain_between_the_daemons_read_and_its_wait_still_wakes_it(told):
    """The forced interleaving: the claim reads its daemon (idle), then the drain commits
    and its notification is heard, and only then does the claim look and wait. With
    `heard` (where the daemon's channel stood before the read: what the API's claim
    passes) the wait sees the drain and answers at once; without it (the control) the
    notification predates the claim's snapshot, and the claim waits its whole wait."""
    name = _own_queue()
    builders.queue(name=name)
    daemon = builders.daemon(queues=[name])
    channel = f"daemon:{daemon.pk}"
    heard = protocol.daemon_heard(daemon.pk)
    row = Daemon.objects.get(pk=daemon.pk)  # idle, as the claim read it
    Daemon.objects.filter(pk=daemon.pk).update(state="draining")
    _heard_bump(channel, heard)
    wait = 10
    steps = protocol.claim_steps(
        daemon=row, wait=wait, tell_draining=True, heard=heard if told else None
    )
    started = time.monotonic()
    assert waits.drive(steps) == []
    took = time.monotonic() - started
    if told:
        assert took < wait / 2 and row.state == "draining"  # it looked again: draining
    else:
        assert took >= wait - 0.5 and row.state == "idle"
