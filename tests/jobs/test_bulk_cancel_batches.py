"""Bulk-cancel works in batches, each its own transaction, so it never holds one lock
over the whole backlog; each batch is one statement, and claims racing it lose nothing
and run nothing twice."""

import threading
import time

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs import services
from jobs.models import Invocation
from jobs.transitions import kill
from tests.support import builders

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "lakeshore.functions.echo"


def _backlog(queue: str, n: int) -> list[int]:
    Invocation.objects.bulk_create([Invocation(queue=queue, function=ECHO) for _ in range(n)])
    return list(Invocation.objects.filter(queue=queue).order_by("id").values_list("id", flat=True))


def _batch_statements(ctx) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if "UPDATE jobs_invocation" in q["sql"]]


def test_it_cancels_everything_queued_in_batches():
    builders.queue(name="w")
    for _ in range(5):
        services.invocation_submit(function=ECHO, queue="w")
    with CaptureQueriesContext(connection) as ctx:
        cancelled = kill.kill_queued_in_batches(queue="w", reason="bulk", batch=2)
    commits = [q for q in ctx.captured_queries if "COMMIT" in q["sql"].upper()]
    assert cancelled == 5
    assert len(_batch_statements(ctx)) == 3  # 2 + 2 + 1
    assert len(commits) == 3  # each batch committed on its own
    assert set(Invocation.objects.values_list("state", "reason")) == {("killed", "bulk")}


@pytest.mark.parametrize(("backlog", "batches"), [(3, 1), (9, 3), (20, 6), (41, 11)])
def test_one_statement_a_batch_whatever_the_backlog(backlog, batches):
    """The statements a bulk-cancel sends grow with the number of batches only (one
    each, in its own transaction), never with the rows: the counts per queue come back
    from the statement, not as a row per invocation. A backlog that fills its last
    batch exactly (20 in batches of 4) takes one more, empty, batch to know it is done."""
    builders.queue(name="w")
    _backlog("w", backlog)
    with CaptureQueriesContext(connection) as ctx:
        assert kill.kill_queued_in_batches(queue="w", reason="bulk", batch=4) == backlog
    assert len(_batch_statements(ctx)) == batches
    assert len(ctx.captured_queries) == 3 * batches  # BEGIN, the statement, COMMIT


def test_the_service_sends_as_many_statements_for_a_big_backlog_as_for_a_small_one():
    """Through the service (the API's and the console's), 3 or 300 queued rows: the
    same statements (the queue's check, one batch, the audit record)."""
    builders.queue(name="small")
    builders.queue(name="big")
    _backlog("small", 3)
    _backlog("big", 300)
    sent = []
    for queue in ("small", "big"):
        with CaptureQueriesContext(connection) as ctx:
            services.invocation_bulk_cancel(queue=queue)
        sent.append(len(ctx.captured_queries))
    assert sent[0] == sent[1]
    assert Invocation.objects.filter(state="killed").count() == 303


def test_it_leaves_running_and_other_queues_alone():
    builders.queue(name="w")
    builders.queue(name="other")
    running, _ = services.invocation_submit(function=ECHO, queue="w")
    builders.claim(daemon=builders.daemon(queues=["w"]))
    queued, _ = services.invocation_submit(function=ECHO, queue="w")
    elsewhere, _ = services.invocation_submit(function=ECHO, queue="other")
    assert services.invocation_bulk_cancel(queue="w") == 1
    states = dict(Invocation.objects.values_list("id", "state"))
    assert states == {running.pk: "running", queued.pk: "killed", elsewhere.pk: "queued"}


def test_every_queue_at_once_counts_each_queue_for_the_metrics(monkeypatch):
    """With no queue, one batch spans queues: the metrics get each queue's count from
    the statement, and together they are what was killed."""
    for name in ("a", "b", "c"):
        builders.queue(name=name)
    for queue, n in (("a", 5), ("b", 2), ("c", 4), ("", 3)):
        _backlog(queue, n)
    counted: list[tuple[str, int]] = []
    monkeypatch.setattr(kill.metrics, "killed_queued", lambda counts: counted.extend(counts))
    assert kill.kill_queued_in_batches(queue=None, reason="all", batch=4) == 14
    totals: dict[str, int] = {}
    for queue, n in counted:
        totals[queue] = totals.get(queue, 0) + n
    assert totals == {"a": 5, "b": 2, "c": 4, "": 3}
    assert not Invocation.objects.filter(state="queued").exists()


def _in_a_thread(target) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run():
        try:
            out["value"] = target()
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_a_claim_between_batches_runs_what_it_took_and_the_rest_is_cancelled(monkeypatch):
    """A daemon claims after the first batch commits and before the second starts: it
    gets rows from what was still queued (the batches go in id order), they run, and
    every other row is killed; nothing is both, nothing is left queued."""
    builders.queue(name="w")
    ids = _backlog("w", 10)
    daemon = builders.daemon(queues=["w"])
    claimed: list[int] = []
    counted: list[tuple[str, int]] = []

    def claim_between_batches():  # after the first batch's commit, in another connection
        if not claimed:
            thread, out = _in_a_thread(lambda: builders.claim(daemon=daemon, limit=2))
            thread.join(30)
            claimed.extend(inv.pk for inv in out["value"])

    def count(counts):
        counted.extend(counts)
        transaction.on_commit(claim_between_batches)

    monkeypatch.setattr(kill.metrics, "killed_queued", count)
    cancelled = kill.kill_queued_in_batches(queue="w", reason="bulk", batch=3)
    assert claimed == ids[3:5]  # the first two after the first batch
    states = dict(Invocation.objects.values_list("id", "state"))
    assert {pk for pk, state in states.items() if state == "running"} == set(claimed)
    assert {pk for pk, state in states.items() if state == "killed"} == set(ids) - set(claimed)
    assert cancelled == 8 == sum(n for _, n in counted)


def _waiting_on_a_lock() -> int:
    """How many statements on invocations wait for a lock now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s",
            ["%UPDATE jobs_invocation%"],
        )
        return cursor.fetchone()[0]


def _until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the other thread"
        time.sleep(0.01)


@pytest.mark.parametrize("claim_ends", ["commits", "rolls back"])
def test_a_batch_waits_for_a_claim_in_flight_and_then_kills_only_what_it_left(claim_ends):
    """A claim holds its rows locked (its transaction is open) while a batch comes to
    them: the batch waits for it rather than skipping them. A claim that commits keeps
    what it took running; one that rolls back leaves its rows queued, and the batch
    then kills them, so nothing queued is left behind (skipping locked rows left them
    queued after the bulk-cancel had answered)."""
    builders.queue(name="w")
    ids = _backlog("w", 6)
    daemon = builders.daemon(queues=["w"])
    holding, release = threading.Event(), threading.Event()

    def claim_and_hold():
        with transaction.atomic():
            taken = [inv.pk for inv in builders.claim(daemon=daemon, limit=2)]
            holding.set()
            assert release.wait(30)
            if claim_ends == "rolls back":
                transaction.set_rollback(True)
        return taken

    claimer, claim = _in_a_thread(claim_and_hold)
    assert holding.wait(30)
    canceller, cancel = _in_a_thread(
        lambda: kill.kill_queued_in_batches(queue="w", reason="bulk", batch=4)
    )
    try:
        _until(_waiting_on_a_lock)  # the batch waits on the claim's rows
        assert "value" not in cancel
    finally:
        release.set()
        claimer.join(30)
        canceller.join(30)
    assert "error" not in claim and "error" not in cancel, (claim, cancel)
    assert claim["value"] == ids[:2]
    states = dict(Invocation.objects.values_list("id", "state"))
    if claim_ends == "commits":
        assert cancel["value"] == 4
        assert [states[pk] for pk in ids] == ["running"] * 2 + ["killed"] * 4
    else:
        assert cancel["value"] == 6
        assert [states[pk] for pk in ids] == ["killed"] * 6


def test_a_bulk_cancel_and_a_queue_removal_lock_in_one_order_and_never_deadlock():
    """A batch holds its first rows and waits for one a third transaction holds; a
    queue removal then comes to the same rows, which a sequential read meets out of id
    order (the first three were rewritten, so they sit after the others). Locked in
    that order the removal would hold the last three while waiting for the batch's
    first, and the batch would wait for them: a deadlock. Both lock in id order whatever
    the plan, so the removal waits holding nothing, and the batch kills all six."""
    builders.queue(name="w")
    ids = _backlog("w", 6)
    Invocation.objects.filter(pk__in=ids[:3]).update(priority=1)  # now after the others
    holding, release = threading.Event(), threading.Event()

    def hold_the_second():
        with transaction.atomic():
            Invocation.objects.select_for_update().get(pk=ids[1])
            holding.set()
            assert release.wait(30)

    def remove():
        with transaction.atomic():
            with connection.cursor() as cursor:  # a big backlog's plan: read in heap order
                cursor.execute("SET LOCAL enable_indexscan = off")
                cursor.execute("SET LOCAL enable_bitmapscan = off")
            return kill.kill_queued_of_queue(queue="w", reason="queue removed")

    holder, _ = _in_a_thread(hold_the_second)
    assert holding.wait(30)
    canceller, cancel = _in_a_thread(
        lambda: kill.kill_queued_in_batches(queue="w", reason="bulk", batch=6)
    )
    try:
        _until(lambda: _waiting_on_a_lock() >= 1)  # the batch, on the second row
        remover, removal = _in_a_thread(remove)
        _until(lambda: _waiting_on_a_lock() >= 2)  # the removal too
    finally:
        release.set()
        holder.join(30)
    canceller.join(30)
    remover.join(30)
    assert "error" not in cancel and "error" not in removal, (cancel, removal)
    assert (cancel["value"], removal["value"]) == (6, 0)
    assert set(Invocation.objects.values_list("state", "reason")) == {("killed", "bulk")}
