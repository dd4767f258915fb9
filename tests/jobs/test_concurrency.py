"""Claims under real concurrency on PostgreSQL: every invocation to exactly one daemon."""

import threading

import pytest
from django.db import connection

from jobs import services
from jobs.models import Invocation
from tests import builders

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
            got = services.invocation_claim(daemon=daemons[i], limit=7)
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


def test_kill_and_claim_of_the_same_invocation_never_both_win():
    builders.queue(name="race")
    daemon = builders.daemon(queues=["race"])
    outcomes = []
    for _ in range(40):
        inv, _ = services.invocation_submit(function="x.y", queue="race")
        result = {}
        barrier = threading.Barrier(2)

        def kill(_i, inv=inv, result=result, barrier=barrier):
            barrier.wait()
            try:
                services.invocation_kill(invocation_id=inv.pk)
                result["kill"] = True
            except services.Conflict:
                result["kill"] = False
            finally:
                connection.close()

        def claim(_i, result=result, barrier=barrier):
            barrier.wait()
            try:
                result["claim"] = bool(services.invocation_claim(daemon=daemon))
            finally:
                connection.close()

        threads = [
            threading.Thread(target=kill, args=(0,)),
            threading.Thread(target=claim, args=(0,)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        inv.refresh_from_db()
        assert result["kill"] != result["claim"], result
        assert inv.state == ("killed" if result["kill"] else "running")
        outcomes.append(result["kill"])
        if not result["kill"]:  # free the daemon's slot for the next round
            services.invocation_complete(
                daemon=daemon, invocation_id=inv.pk, attempt=1, succeeded=True
            )


def test_a_claim_long_polls_until_work_arrives():
    import time

    builders.queue(name="lp")
    daemon = builders.daemon(queues=["lp"])

    def submit_later(_i):
        time.sleep(0.5)
        services.invocation_submit(function="x.y", queue="lp")

    waiter = threading.Thread(target=lambda: _run_threads(submit_later, 1))
    started = time.monotonic()
    waiter.start()
    got = services.invocation_claim(daemon=daemon, wait=5)
    waited = time.monotonic() - started
    waiter.join()
    assert len(got) == 1
    assert 0.4 < waited < 3  # it waited for the submit, and answered soon after it


def test_a_claim_with_nothing_to_do_answers_empty_after_its_wait():
    import time

    builders.queue(name="lp")
    daemon = builders.daemon(queues=["lp"])
    started = time.monotonic()
    assert services.invocation_claim(daemon=daemon, wait=0.6) == []
    assert time.monotonic() - started >= 0.6
