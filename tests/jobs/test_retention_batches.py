"""Retention, how: in batches that skip locked rows, within bounds (batch size, a cap
of batches, a time budget) that the next run picks up after, the kinds taking turns,
several sweeps at once deleting each row once, never inside a caller's transaction; and
how it is run: the beat task every interval, the `prune` command; on the real database."""

import json
import threading
import time
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import retention, tasks
from jobs.models import Invocation
from jobs.retention import retention_sweep
from lakeshore_admin import hooks
from queues.models import QueueEvent
from tests.jobs.retention_rows import NOW, _deletes, _events, _ids, _invocations

pytestmark = pytest.mark.django_db


def test_it_deletes_in_batches_until_nothing_is_due():
    _invocations(5)
    _events(5)
    with CaptureQueriesContext(connection) as ctx:
        assert retention_sweep(now=NOW, batch_size=2) == {
            "invocations": 5,
            "events": 5,
            "frames": 0,
            "streams": 0,
            "samples": 0,
            "audit": 0,
            "commands": 0,
        }
    # 2 + 2 + 1 for each kind: the short third batch says nothing more is due (and one
    # empty batch of frames, one of stream totals, one of samples, one of the audit
    # trail, one of commands)
    assert len(_deletes(ctx)) == 11
    assert all("LIMIT 2" in sql and "SKIP LOCKED" in sql for sql in _deletes(ctx))
    assert not Invocation.objects.exists() and not QueueEvent.objects.exists()


def test_it_stops_after_max_batches_and_the_next_run_goes_on():
    invocations = _invocations(5)
    events = _events(5)
    first = retention_sweep(now=NOW, batch_size=2, max_batches=1)
    assert first == {
        "invocations": 2,
        "events": 2,
        "frames": 0,
        "streams": 0,
        "samples": 0,
        "audit": 0,
        "commands": 0,
    }
    lowest = sorted(_ids(invocations))[:2]  # lowest ids first
    assert not Invocation.objects.filter(pk__in=lowest).exists()
    assert Invocation.objects.count() == 3 and QueueEvent.objects.count() == 3
    assert not QueueEvent.objects.filter(pk__in=sorted(_ids(events))[:2]).exists()

    assert retention_sweep(now=NOW, batch_size=2, max_batches=1) == first
    assert retention_sweep(now=NOW, batch_size=2, max_batches=1) == {
        "invocations": 1,
        "events": 1,
        "frames": 0,
        "streams": 0,
        "samples": 0,
        "audit": 0,
        "commands": 0,
    }
    assert retention_sweep(now=NOW, batch_size=2, max_batches=1) == {
        "invocations": 0,
        "events": 0,
        "frames": 0,
        "streams": 0,
        "samples": 0,
        "audit": 0,
        "commands": 0,
    }


def test_it_checks_its_bounds():
    with pytest.raises(ValueError):
        retention_sweep(batch_size=0)
    with pytest.raises(ValueError):
        retention_sweep(max_batches=0)
    with pytest.raises(ValueError):
        retention_sweep(budget=0)


@pytest.fixture
def _slow_batches():
    """Each batch takes 0.1 s longer (a hook after it), so a 0.05 s budget is spent
    after the first."""
    hooks.register("retention.batch_done", lambda: time.sleep(0.1))
    yield
    hooks.clear("retention.batch_done")


@pytest.mark.usefixtures("_slow_batches")
def test_a_spent_budget_ends_the_run_and_the_next_run_goes_on():
    _invocations(5)
    _events(5)
    counts = retention_sweep(now=NOW, batch_size=2, budget=0.05)
    # one batch of the first kind, then the budget is spent: nothing else runs
    assert counts["invocations"] == 2 and sum(counts.values()) == 2
    assert Invocation.objects.count() == 3 and QueueEvent.objects.count() == 5
    hooks.clear("retention.batch_done")
    assert retention_sweep(now=NOW, batch_size=2, budget=60)["events"] == 5
    assert not Invocation.objects.exists()


def test_the_kinds_take_turns_so_a_flood_of_one_starves_no_other():
    _invocations(7)
    _events(2)
    with CaptureQueriesContext(connection) as ctx:
        retention_sweep(now=NOW, batch_size=2)
    tables = [
        "invocation" if "jobs_invocation" in sql else "event"
        for sql in _deletes(ctx)
        if "jobs_invocation" in sql or "queues_queueevent" in sql
    ]
    # events are done in their first turn (a full batch), then their second (empty)
    assert tables[:4] == ["invocation", "event", "invocation", "event"]
    assert tables[4:] == ["invocation", "invocation"]  # 2, 2, 2, 1


def test_it_goes_on_past_what_the_old_cap_of_batches_allowed():
    _invocations(25)
    assert retention_sweep(now=NOW, batch_size=1)["invocations"] == 25
    assert not Invocation.objects.exists()


# ------------------------------------------------------------------------ concurrency


def _in_thread(target):
    errors = []

    def wrapped():
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - surfaced by the caller
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=wrapped)
    thread.start()
    return thread, errors


@pytest.mark.django_db(transaction=True)
def test_it_skips_rows_another_transaction_holds_without_waiting():
    rows = _invocations(3)
    held = rows[0].pk
    locked, release = threading.Event(), threading.Event()

    def holder():
        with transaction.atomic():
            Invocation.objects.select_for_update().filter(pk=held).get()
            locked.set()
            release.wait(30)

    thread, errors = _in_thread(holder)
    try:
        assert locked.wait(30)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")  # a wait would fail, not hang
        assert retention_sweep(now=NOW) == {
            "invocations": 2,
            "events": 0,
            "frames": 0,
            "streams": 0,
            "samples": 0,
            "audit": 0,
            "commands": 0,
        }
    finally:
        release.set()
        thread.join(30)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert not errors, errors
    assert list(Invocation.objects.values_list("pk", flat=True)) == [held]
    assert retention_sweep(now=NOW) == {
        "invocations": 1,
        "events": 0,
        "frames": 0,
        "streams": 0,
        "samples": 0,
        "audit": 0,
        "commands": 0,
    }


@pytest.mark.django_db(transaction=True)
def test_two_sweeps_at_once_delete_each_row_once():
    _invocations(400)
    _events(400)
    results = []
    barrier = threading.Barrier(4)

    def sweeper():
        barrier.wait(30)
        results.append(retention_sweep(now=NOW, batch_size=7, max_batches=1000))

    threads = [_in_thread(sweeper) for _ in range(4)]
    for thread, _ in threads:
        thread.join(60)
    assert not [e for _, errors in threads for e in errors]
    assert sum(r["invocations"] for r in results) == 400
    assert sum(r["events"] for r in results) == 400
    assert not Invocation.objects.exists() and not QueueEvent.objects.exists()


def test_it_refuses_to_run_inside_a_callers_transaction():
    """Every batch commits on its own; inside an outer transaction that would hold all
    the locks to its end, so the sweep refuses."""
    with transaction.atomic(), pytest.raises(RuntimeError):
        retention_sweep(now=NOW)


# ------------------------------------------------------------------------ how it is run


def test_the_beat_task_runs_the_sweep_every_interval_with_its_budget(monkeypatch):
    entry = settings.CELERY_BEAT_SCHEDULE["retention"]
    assert entry["task"] == "jobs.retention" == tasks.retention_sweep.name
    assert entry["schedule"] == settings.LAKESHORE_RETENTION_EVERY_SECONDS == 300
    assert 0 < entry["options"]["expires"] <= entry["schedule"]
    assert settings.LAKESHORE_RETENTION_BUDGET_SECONDS == 60
    budgets = []
    real = retention.retention_sweep
    monkeypatch.setattr(
        retention, "retention_sweep", lambda **kw: budgets.append(kw["budget"]) or real(**kw)
    )
    _invocations(1)
    _events(1)
    assert tasks.retention_sweep() == {
        "invocations": 1,
        "events": 1,
        "frames": 0,
        "streams": 0,
        "samples": 0,
        "audit": 0,
        "commands": 0,
    }
    assert budgets == [60]


def test_the_prune_command_prints_what_it_deleted():
    _invocations(2)
    _invocations(1, finished_at=timezone.now())
    _events(3)
    out = StringIO()
    call_command("prune", stdout=out)
    assert json.loads(out.getvalue()) == {
        "invocations": 2,
        "events": 3,
        "frames": 0,
        "streams": 0,
        "samples": 0,
        "audit": 0,
        "commands": 0,
    }
    assert Invocation.objects.count() == 1


@pytest.mark.usefixtures("_slow_batches")
def test_the_prune_command_takes_a_budget():
    _invocations(3)
    out = StringIO()
    call_command("prune", "--budget", "0.05", stdout=out)
    assert json.loads(out.getvalue())["invocations"] == 3  # one batch of 5000: all
    assert not Invocation.objects.exists()


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_the_prune_command_refuses_a_bad_budget(value):
    with pytest.raises(CommandError, match="--budget"):
        call_command("prune", "--budget", value, stdout=StringIO())
