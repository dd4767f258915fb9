"""Issue 17: retention keeps pace. One `manage.py prune` deletes a backlog of 300,000
finished invocations past retention (the old rule, 5,000 × 20 a run, left two thirds
behind), batch after batch, each a statement over at most BATCH_SIZE rows, and a run
still ends with nothing due when work keeps falling due while it runs. The rate of
deletion, against the 5,000 rows a second that 1,000 jobs/s needs: bench/retention.py
(a figure of this machine, not a test's)."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import Invocation, ResultFrame
from jobs.retention import BATCH_SIZE, retention_sweep
from lakeshore_admin import hooks

pytestmark = [
    pytest.mark.django_db(transaction=True),  # every batch commits, as in production
    # a run within its time budget: never beside the tests that load both cores (their group)
    pytest.mark.xdist_group("load"),
    pytest.mark.security,
]

BACKLOG = 300_000
JOBS_PER_SECOND = 1_000
OLD = timezone.now() - timedelta(days=settings.LAKESHORE_RETENTION_DAYS, hours=1)

_INVOCATIONS = """
INSERT INTO jobs_invocation (queue, function, args, kwargs, priority, state, attempts,
                             max_attempts, key, reason, error, created_at, started_at,
                             finished_at, wire, run_config, result)
SELECT 'q', 'm.f', '[1, 2]', '{}', 0, 'succeeded', 1, 1, '', '', '', %(at)s, %(at)s,
       %(at)s, '', '{}', '3'
  FROM generate_series(1, %(n)s)
"""
_FRAMES = """
INSERT INTO jobs_resultframe (stream, seq, data, final, created_at)
SELECT 's' || %(tag)s || '-' || g, 0, '\\x00'::bytea, true, %(at)s
  FROM generate_series(1, %(n)s) g
"""


@pytest.fixture(autouse=True)
def _no_hooks_left():
    yield
    hooks.clear()


def _finished_past_retention(n: int, *, frames: int = 0, tag: str = "") -> None:
    with connection.cursor() as cursor:
        cursor.execute(_INVOCATIONS, {"at": OLD, "n": n})
        if frames:
            cursor.execute(_FRAMES, {"at": OLD, "n": frames, "tag": tag})


def _due() -> int:
    cutoff = timezone.now() - timedelta(days=settings.LAKESHORE_RETENTION_DAYS)
    return (
        Invocation.objects.filter(finished_at__lt=cutoff).count()
        + ResultFrame.objects.filter(created_at__lt=cutoff).count()
    )


def test_one_prune_deletes_300000_finished_invocations_past_retention():
    _finished_past_retention(BACKLOG)
    young = Invocation.objects.create(function="m.f", state="succeeded", finished_at=timezone.now())
    out = StringIO()
    with CaptureQueriesContext(connection) as queries:
        call_command("prune", stdout=out)

    assert json.loads(out.getvalue())["invocations"] == BACKLOG
    assert list(Invocation.objects.values_list("pk", flat=True)) == [young.pk]
    # One statement a batch: the invocations in full batches and a short one that says
    # none is left, every other kind (nothing due) in one short batch.
    batches = [q["sql"] for q in queries.captured_queries if "DELETE" in q["sql"]]
    invocation_batches = [sql for sql in batches if "DELETE FROM jobs_invocation" in sql]
    assert len(invocation_batches) == BACKLOG // BATCH_SIZE + 1
    assert len(batches) - len(invocation_batches) == 6


def test_negative_control_the_old_cap_of_20_batches_leaves_two_thirds_behind():
    _finished_past_retention(BACKLOG)
    counts = retention_sweep(max_batches=20)  # the rule before issue 17: 5,000 × 20
    assert counts["invocations"] == 100_000
    assert Invocation.objects.count() == 200_000


def test_a_run_catches_up_with_work_falling_due_while_it_runs():
    """1,000 finished jobs (and their frames) fall due after each of the run's first
    30 batches (a second of a 1,000 jobs/s server each time, arriving every few
    milliseconds). The run keeps going until it has caught up: nothing is due when it
    ends."""
    _finished_past_retention(50_000, frames=50_000, tag="backlog")
    arrived = []

    def inflow():
        if len(arrived) < 30:
            arrived.append(JOBS_PER_SECOND)
            _finished_past_retention(JOBS_PER_SECOND, frames=JOBS_PER_SECOND, tag=len(arrived))

    hooks.register("retention.batch_done", inflow)
    counts = retention_sweep(budget=settings.LAKESHORE_RETENTION_BUDGET_SECONDS)
    hooks.clear("retention.batch_done")

    assert len(arrived) == 30
    assert counts["invocations"] == counts["frames"] == 50_000 + sum(arrived)
    assert _due() == 0


def test_negative_control_a_run_capped_by_batches_falls_behind_the_same_inflow():
    _finished_past_retention(50_000, frames=50_000, tag="backlog")
    arrived = []

    def inflow():
        if len(arrived) < 30:
            arrived.append(JOBS_PER_SECOND)
            _finished_past_retention(JOBS_PER_SECOND, frames=JOBS_PER_SECOND, tag=len(arrived))

    hooks.register("retention.batch_done", inflow)
    retention_sweep(max_batches=5)  # the old rule's cap, scaled to this backlog
    hooks.clear("retention.batch_done")

    assert _due() > 0
