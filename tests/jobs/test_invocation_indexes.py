"""Two indexes leave out what a bulk-cancel writes (jobs/models.py): inv_daemon_id the
rows with no daemon (queued, killed while queued), inv_finished the killed ones. The
reads they serve say so in their WHERE clause, so PostgreSQL can still use them; a pace
(ETA) is not made of kills."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import services
from jobs.models import Invocation
from queues.views import add_activity
from tests.support import builders

pytestmark = pytest.mark.django_db


def _plan(statement) -> str:
    """The plan of a captured statement or a queryset, with sequential scans priced out
    of reach (a small test table would be read whole otherwise)."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        if isinstance(statement, str):
            cursor.execute(f"EXPLAIN {statement}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        else:
            plan = statement.explain()
        cursor.execute("RESET enable_seqscan")
    return plan


def _statements(action, word: str) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        action()
    return [q["sql"] for q in ctx.captured_queries if word in q["sql"]]


def test_the_pace_of_a_queue_leaves_out_kills_and_reads_inv_finished():
    builders.queue(name="train")
    now = timezone.now()
    ran = Invocation.objects.bulk_create(
        [Invocation(queue="train", function="a.b", state="succeeded") for _ in range(20)]
    )
    Invocation.objects.filter(pk__in=[r.pk for r in ran]).update(finished_at=now)
    for _ in range(50):
        services.invocation_submit(function="a.b", queue="train")
    assert services.invocation_bulk_cancel(queue="train") == 50  # 50 killed just now
    mine, _ = services.invocation_submit(function="a.b", queue="train")
    position = services.queue_position(mine)
    (eta,) = _statements(lambda: services.queue_eta(mine, position), "finished_at")[:1]
    # 20 ran in the window (2 a minute); the 50 killed are no pace
    assert services.queue_eta(mine, position)["rate_per_minute"] == pytest.approx(2.0)
    assert "inv_finished" in _plan(eta)


def test_the_queue_lists_counts_of_what_ended_read_their_indexes():
    queue = builders.queue(name="train")
    queue.pending, queue.oldest_queued_at = 0, None  # what the queues page reads first
    failed, succeeded = _statements(
        lambda: add_activity([queue], now=timezone.now()), "finished_at"
    )
    # an index over when they ended (on so small a table, whichever the planner likes)
    for statement in (failed, succeeded):
        plan = _plan(statement)
        assert any(name in plan for name in ("inv_failures", "inv_finished", "inv_ended")), plan


def test_a_lookup_by_daemon_reads_inv_daemon_id():
    invocation = builders.invocation("succeeded")
    by_daemon = Invocation.objects.filter(daemon_id=invocation.daemon_id).order_by("-id")[:50]
    assert list(by_daemon) == [invocation]
    assert "inv_daemon_id" in _plan(by_daemon)


def test_a_read_that_does_not_say_so_cannot_use_them():
    """Negative control of the plans above: a read that does not say its rows have a
    daemon, or are not killed, cannot use the partial index (PostgreSQL would return
    wrong answers from it), so the tests would catch a predicate the reads do not meet."""
    builders.queue(name="train")
    window = timezone.now() - timedelta(minutes=10)
    every_finish = Invocation.objects.filter(queue="train", finished_at__gte=window)
    assert "inv_finished" not in _plan(every_finish)
    no_daemon = Invocation.objects.filter(daemon_id__isnull=True).order_by("-id")[:50]
    assert "inv_daemon_id" not in _plan(no_daemon)
