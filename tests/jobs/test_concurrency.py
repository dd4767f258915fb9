"""Claims under real concurrency on PostgreSQL: every invocation to exactly one daemon."""

import threading
import time
from collections import Counter

import pytest
from django.db import connection

from fleet import protocol
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from tests.support import builders

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 16
INVOCATIONS = 2000


def _run_threads(target, n: int) -> None:
    errors: list[BaseException] = []

    def wrapped(i):
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def _duplicates(claims: list[list[int]]) -> set[int]:
    seen: set[int] = set()
    dupes: set[int] = set()
    for batch in claims:
        for pk in batch:
            (dupes if pk in seen else seen).add(pk)
    return dupes


def _backlog():
    builders.queue(name="hot", kind="fifo")
    Invocation.objects.bulk_create(
        [Invocation(queue="hot", function="x.y") for _ in range(INVOCATIONS)]
    )
    return [builders.daemon(queues=["hot"]) for _ in range(THREADS)]


def test_it_hands_each_invocation_to_exactly_one_daemon():
    daemons = _backlog()
    claims: list[list[int]] = [[] for _ in range(THREADS)]

    def claimer(i):
        while True:
            got = builders.claim(daemon=daemons[i], limit=7)
            if not got:
                return
            claims[i].extend(inv.pk for inv in got)

    _run_threads(claimer, THREADS)
    assert _duplicates(claims) == set()
    assert sum(len(c) for c in claims) == INVOCATIONS
    assert set(Invocation.objects.values_list("attempts", flat=True)) == {1}
    assert Invocation.objects.filter(state="running").count() == INVOCATIONS
    assert sum(1 for c in claims if c) > 1  # the work really was shared


def test_the_duplicate_check_catches_a_naive_read_then_update():
    """Negative control: the same harness, with a claim that reads then updates without
    locking, finds duplicates — so the test above could fail."""
    daemons = _backlog()
    claims: list[list[int]] = [[] for _ in range(THREADS)]
    barrier = threading.Barrier(THREADS)

    def naive(i):
        ids = list(
            Invocation.objects.filter(queue="hot", state="queued")
            .order_by("id")
            .values_list("id", flat=True)[:7]
        )
        barrier.wait()  # every thread has read before anyone writes
        Invocation.objects.filter(pk__in=ids).update(state="running", daemon=daemons[i])
        claims[i].extend(ids)

    _run_threads(naive, THREADS)
    assert _duplicates(claims), "the naive claim should have handed rows out twice"


KILL_CLAIM_ROUNDS = 40  # at least; more (up to KILL_CLAIM_MAX) until each side has won
KILL_CLAIM_MAX = 400


def test_kill_and_claim_of_the_same_invocation_never_both_win():
    """Each round a kill and a claim race for one queued invocation. Exactly one wins:
    either the kill killed it and the claim came back empty, or the claim took it and
    the kill was refused with a Conflict saying it runs, on this daemon. Rounds go on
    until each side has won at least once, so both outcomes are checked."""
    builders.queue(name="race")
    daemon = builders.daemon(queues=["race"])
    outcomes: list[str] = []
    while len(outcomes) < KILL_CLAIM_ROUNDS or len(set(outcomes)) < 2:
        if len(outcomes) >= KILL_CLAIM_MAX:
            break
        inv, _ = services.invocation_submit(function="x.y", queue="race")
        seen: dict = {}
        barrier = threading.Barrier(2)

        def kill(inv=inv, seen=seen, barrier=barrier):
            barrier.wait()
            try:
                seen["kill"] = services.invocation_kill(invocation_id=inv.pk).state
            except services.Conflict as exc:
                seen["kill"] = exc

        def claim(seen=seen, barrier=barrier):
            barrier.wait()
            seen["claim"] = [got.pk for got in builders.claim(daemon=daemon)]

        _run_threads(lambda i, racers=(kill, claim): racers[i](), 2)
        inv.refresh_from_db()
        if seen["claim"]:  # the claim won
            assert seen["claim"] == [inv.pk]
            refused = seen["kill"]
            assert isinstance(refused, services.Conflict), seen
            assert (refused.status, refused.code) == (409, "invocation_running")
            assert refused.extra["state"] == "running"
            assert refused.extra["worker"] == str(daemon.pk)
            assert (inv.state, inv.daemon_id, inv.attempts) == ("running", daemon.pk, 1)
            outcomes.append("claimed")
            protocol.invocation_complete(
                daemon=daemon, invocation_id=inv.pk, attempt=1, succeeded=True
            )
        else:  # the kill won, and the claim found nothing to take
            assert seen["kill"] == "killed", seen
            assert (inv.state, inv.daemon_id, inv.attempts) == ("killed", None, 0)
            outcomes.append("killed")
    # the race went both ways; every round had exactly one winner, and the rows agree
    assert set(outcomes) == {"claimed", "killed"}, Counter(outcomes)
    assert Counter(outcomes) == Counter(
        {
            "claimed": Invocation.objects.filter(queue="race", state="succeeded").count(),
            "killed": Invocation.objects.filter(queue="race", state="killed").count(),
        }
    )
    assert not Invocation.objects.filter(queue="race", state__in=["queued", "running"]).exists()


def _until(condition, timeout: float = 30) -> None:
    """Wait for something another thread does (a condition, not a duration)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the other thread"
        time.sleep(0.01)


def _long_poll_check() -> None:
    """The claim looks, finds nothing, and waits; a submit arrives; the claim comes back
    with exactly that invocation, and not before the submit."""
    builders.queue(name="lp")
    daemon = builders.daemon(queues=["lp"])
    log: list[str] = []
    lock = threading.Lock()
    returned = threading.Event()
    got: dict = {}

    def claimer():
        try:
            got["claimed"] = builders.claim(daemon=daemon, wait=30)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            got["error"] = exc
        finally:
            with lock:
                log.append("claim returned")
            returned.set()
            connection.close()

    thread = threading.Thread(target=claimer)
    thread.start()
    try:
        # A claim heartbeats its daemon in the transaction that looks for work: once the
        # heartbeat is written, the claim has looked at the empty queue and found nothing.
        _until(
            lambda: Daemon.objects.filter(pk=daemon.pk, last_heartbeat_at__isnull=False).exists()
        )
        assert not returned.is_set(), got  # it waits, rather than answering empty at once
        with lock:
            log.append("submitting")
        inv, _ = services.invocation_submit(function="x.y", queue="lp")
        assert returned.wait(60), "the waiting claim never saw the submit"
    finally:
        thread.join(60)
    assert "error" not in got, got["error"]
    assert log == ["submitting", "claim returned"]
    assert [i.pk for i in got["claimed"]] == [inv.pk]
    inv.refresh_from_db()
    assert (inv.state, inv.daemon_id) == ("running", daemon.pk)


def test_a_claim_long_polls_until_work_arrives():
    _long_poll_check()


def test_the_long_poll_check_sees_a_claim_that_does_not_wait(monkeypatch):
    """Negative control: a claim that ignores `wait` answers empty before the submit."""
    claim = builders.claim
    monkeypatch.setattr(builders, "claim", lambda **kw: claim(**{**kw, "wait": 0}))
    with pytest.raises(AssertionError):
        _long_poll_check()


def test_a_claim_with_nothing_to_do_answers_empty_after_its_wait():
    builders.queue(name="lp")
    daemon = builders.daemon(queues=["lp"])
    started = time.monotonic()
    assert builders.claim(daemon=daemon, wait=0.6) == []
    # a lower bound only (it answered no sooner than its wait), never a window
    assert time.monotonic() - started >= 0.6
