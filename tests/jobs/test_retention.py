"""Retention: finished invocations and queue events older than LAKESHORE_RETENTION_DAYS
go, in batches, on the real database."""

import json
import runpy
import sys
import threading
import time
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection, models, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import commands
from fleet.models import Daemon, DaemonCommand
from jobs import retention, tasks
from jobs.models import TERMINAL_STATES, Invocation, InvocationState, JobLog, LogChunk
from jobs.retention import retention_sweep
from lakeshore_admin import hooks
from queues.models import EventAction, QueueEvent
from tests import builders

pytestmark = pytest.mark.django_db

NOW = timezone.now()
OLD = NOW - timedelta(days=settings.LAKESHORE_RETENTION_DAYS, seconds=1)
YOUNG = NOW - timedelta(days=settings.LAKESHORE_RETENTION_DAYS) + timedelta(minutes=1)


def _invocations(n, state=InvocationState.SUCCEEDED, finished_at=OLD, **fields):
    return Invocation.objects.bulk_create(
        [
            Invocation(function="x.y", state=state, finished_at=finished_at, **fields)
            for _ in range(n)
        ]
    )


def _events(n, at=OLD, queue=None):
    queue = queue or builders.queue()
    return QueueEvent.objects.bulk_create(
        [
            QueueEvent(
                queue=queue,
                at=at,
                action=EventAction.SCALE_UP,
                reason="r",
                daemons=0,
                busy=0,
                pending=0,
                utilization=0.0,
                desired=1,
            )
            for _ in range(n)
        ]
    )


def _ids(rows):
    return {row.pk for row in rows}


def _deletes(ctx) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if "DELETE" in q["sql"]]


def test_it_deletes_old_finished_invocations_and_keeps_the_rest():
    old = [inv for state in TERMINAL_STATES for inv in _invocations(1, state=state)]
    young = _invocations(2, finished_at=YOUNG)
    # queued and running stay whatever their age (finished_at set or not)
    waiting = _invocations(1, state=InvocationState.QUEUED, finished_at=None)
    waiting += _invocations(1, state=InvocationState.QUEUED)
    waiting += _invocations(1, state=InvocationState.RUNNING, started_at=OLD)
    waiting += _invocations(1, state=InvocationState.RUNNING)
    unfinished = _invocations(1, state=InvocationState.FAILED, finished_at=None)
    Invocation.objects.filter(pk__in=_ids(waiting + unfinished)).update(created_at=OLD)

    assert retention_sweep(now=NOW) == {
        "invocations": len(old),
        "events": 0,
        "frames": 0,
        "streams": 0,
        "samples": 0,
        "audit": 0,
        "commands": 0,
    }
    assert len(old) == 4
    left = set(Invocation.objects.values_list("pk", flat=True))
    assert left == _ids(young + waiting + unfinished)


def test_it_deletes_old_result_frames_and_keeps_young_ones():
    from jobs.models import ResultFrame

    ResultFrame.objects.create(stream="1", seq=0, data=b"old")
    ResultFrame.objects.create(stream="1", seq=1, data=b"young")
    ResultFrame.objects.filter(seq=0).update(created_at=OLD)
    ResultFrame.objects.filter(seq=1).update(created_at=YOUNG)
    assert retention_sweep(now=NOW) == {
        "invocations": 0,
        "events": 0,
        "frames": 1,
        "streams": 0,
        "samples": 0,
        "audit": 0,
        "commands": 0,
    }
    assert list(ResultFrame.objects.values_list("data", flat=True)) == [b"young"]


def _samples(queue, *ats):
    from queues.models import QueueSample

    return QueueSample.objects.bulk_create(
        [
            QueueSample(
                queue=queue, at=at, pending=1, running=0, daemons=0, busy=0, desired=0,
                utilization=0.0,
            )
            for at in ats
        ]
    )  # fmt: skip


def test_it_deletes_old_samples_in_batches_and_keeps_young_ones():
    from queues.models import QueueSample

    queue = builders.queue()
    minute = timedelta(minutes=1)
    days = timedelta(days=settings.LAKESHORE_SAMPLE_RETENTION_DAYS)  # their own (7)
    old, young_at = NOW - days - timedelta(seconds=1), NOW - days + minute
    _samples(queue, *(old.replace(second=0) - i * minute for i in range(5)))
    young = _samples(queue, young_at, young_at + minute)
    with CaptureQueriesContext(connection) as ctx:
        assert retention_sweep(now=NOW, batch_size=2) == {
            "invocations": 0,
            "events": 0,
            "frames": 0,
            "streams": 0,
            "samples": 5,
            "audit": 0,
            "commands": 0,
        }
    sample_deletes = [sql for sql in _deletes(ctx) if "queues_queuesample" in sql]
    assert len(sample_deletes) == 3  # 2 + 2 + 1
    assert all("LIMIT 2" in sql and "SKIP LOCKED" in sql for sql in sample_deletes)
    assert set(QueueSample.objects.values_list("pk", flat=True)) == _ids(young)


def test_the_audit_trail_is_kept_for_its_own_retention(settings):
    from accounts.models import AuditEvent

    days = timedelta(days=settings.LAKESHORE_AUDIT_RETENTION_DAYS)
    AuditEvent.objects.create(
        at=NOW - days - timedelta(seconds=1), actor="a", via="api", action="queue.pause"
    )
    kept = AuditEvent.objects.create(at=OLD, actor="a", via="api", action="queue.pause")
    assert retention_sweep(now=NOW)["audit"] == 1
    assert list(AuditEvent.objects.values_list("pk", flat=True)) == [kept.pk]  # 30 days is young


def test_it_deletes_old_events_and_keeps_young_ones():
    queue = builders.queue()
    old = _events(3, queue=queue)
    young = _events(2, at=YOUNG, queue=queue)
    assert retention_sweep(now=NOW) == {
        "invocations": 0,
        "events": 3,
        "frames": 0,
        "streams": 0,
        "samples": 0,
        "audit": 0,
        "commands": 0,
    }
    assert set(QueueEvent.objects.values_list("pk", flat=True)) == _ids(young)
    assert not _ids(old) & set(QueueEvent.objects.values_list("pk", flat=True))


def test_it_keeps_everything_at_the_default_cutoff_of_now():
    """Without `now`, the cutoff is LAKESHORE_RETENTION_DAYS before the present."""
    _invocations(1, finished_at=timezone.now() - timedelta(days=1))
    _events(1, at=timezone.now() - timedelta(days=1))
    assert retention_sweep() == {
        "invocations": 0,
        "events": 0,
        "frames": 0,
        "streams": 0,
        "samples": 0,
        "audit": 0,
        "commands": 0,
    }


def test_it_reads_the_retention_days_setting(settings):
    _invocations(1, finished_at=NOW - timedelta(days=3))
    _events(1, at=NOW - timedelta(days=3))
    settings.LAKESHORE_RETENTION_DAYS = 5
    assert retention_sweep(now=NOW) == {
        "invocations": 0,
        "events": 0,
        "frames": 0,
        "streams": 0,
        "samples": 0,
        "audit": 0,
        "commands": 0,
    }
    settings.LAKESHORE_RETENTION_DAYS = 2
    assert retention_sweep(now=NOW) == {
        "invocations": 1,
        "events": 1,
        "frames": 0,
        "streams": 0,
        "samples": 0,
        "audit": 0,
        "commands": 0,
    }


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


def test_it_deletes_what_a_daemon_ran_and_the_daemon_still_shows_what_it_runs():
    (done,) = _invocations(1)
    (young,) = _invocations(1, finished_at=YOUNG)
    daemon = builders.daemon()
    Invocation.objects.filter(pk=done.pk).update(daemon=daemon)
    running = Invocation.objects.create(
        queue="", function="m.f", state="running", daemon=daemon, created_at=OLD
    )
    assert retention_sweep(now=NOW)["invocations"] == 1
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # as at a real commit
    assert not Invocation.objects.filter(pk=done.pk).exists()
    assert Invocation.objects.filter(pk__in=[young.pk, running.pk]).count() == 2
    shown = Daemon.objects.for_list().get(pk=daemon.pk)
    assert shown.current_invocation_id == running.pk


def test_a_retry_outlives_the_invocation_it_retried():
    (done,) = _invocations(1)
    Invocation.objects.filter(pk=done.pk).update(state="failed")
    from jobs import services

    retry = services.invocation_retry(invocation_id=done.pk)
    assert retention_sweep(now=NOW)["invocations"] == 1
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # nothing to trip over
    retry.refresh_from_db()
    assert retry.retry_of_id == done.pk and not Invocation.objects.filter(pk=done.pk).exists()


def test_no_foreign_key_with_a_constraint_references_invocations_or_events():
    """The sweep deletes with raw SQL and clears nothing; a new foreign key to
    Invocation or QueueEvent must be handled in jobs/retention.py."""
    incoming = {
        (model, field.name, field.related_model, field.remote_field.on_delete)
        for model in apps.get_models(include_auto_created=True)
        for field in model._meta.concrete_fields
        if field.is_relation and field.related_model in (Invocation, QueueEvent)
    }
    assert incoming == {
        # no database constraint: swept by its own age (test below)
        (DaemonCommand, "invocation", Invocation, models.DO_NOTHING),
        (Invocation, "retry_of", Invocation, models.SET_NULL),  # no database constraint
        # no database constraint: deleted in the invocations' own statement
        (JobLog, "invocation", Invocation, models.DO_NOTHING),
        (LogChunk, "invocation", Invocation, models.DO_NOTHING),
    }
    assert not Invocation._meta.get_field("retry_of").db_constraint
    assert not DaemonCommand._meta.get_field("invocation").db_constraint
    assert not JobLog._meta.get_field("invocation").db_constraint
    assert not LogChunk._meta.get_field("invocation").db_constraint
    # the table and column names jobs/retention.py writes out
    assert (Invocation._meta.db_table, QueueEvent._meta.db_table) == (
        "jobs_invocation",
        "queues_queueevent",
    )


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


# ------------------------------------------------------------------------ the setting

SETTINGS_FILE = Path(settings.BASE_DIR) / "lakeshore_admin" / "settings.py"


def _load_settings(monkeypatch, tmp_path, value):
    """Run the real settings file in a fresh namespace, with a DATABASE_URL that is only
    parsed (no server starts) and var/ in a temporary folder."""
    monkeypatch.setenv("DATABASE_URL", "postgres://u@127.0.0.1:1/none")
    monkeypatch.setenv("DJANGO_SECRET_KEY", "test")
    monkeypatch.setenv("LAKESHORE_VAR_DIR", str(tmp_path))
    if value is None:
        monkeypatch.delenv("LAKESHORE_RETENTION_DAYS", raising=False)
    else:
        monkeypatch.setenv("LAKESHORE_RETENTION_DAYS", value)
    # settings.py takes the domain's settings from settings_limits.py: read that anew too
    monkeypatch.delitem(sys.modules, "lakeshore_admin.settings_limits")
    return runpy.run_path(str(SETTINGS_FILE))


@pytest.mark.django_db(False)
@pytest.mark.parametrize("value", ["0", "-3", "abc", "1.5"])
def test_it_fails_settings_loading_on_a_bad_retention_days(monkeypatch, tmp_path, value):
    with pytest.raises(ImproperlyConfigured, match="LAKESHORE_RETENTION_DAYS"):
        _load_settings(monkeypatch, tmp_path, value)


@pytest.mark.django_db(False)
@pytest.mark.parametrize(("value", "days"), [(None, 30), ("", 30), ("1", 1), ("90", 90)])
def test_it_reads_retention_days_from_the_environment(monkeypatch, tmp_path, value, days):
    assert _load_settings(monkeypatch, tmp_path, value)["LAKESHORE_RETENTION_DAYS"] == days


def test_daemon_commands_go_with_the_invocations_age():

    builders.queue(name="q")
    daemon = builders.daemon(queues=["q"])
    inv = _invocations(1)[0]
    old = commands.command_add(daemon=daemon, invocation=inv, verb="kill", signal="KILL", by="x")
    new = commands.command_add(daemon=daemon, invocation=inv, verb="kill", signal="KILL", by="y")
    DaemonCommand.objects.filter(pk=old.pk).update(created_at=OLD)
    DaemonCommand.objects.filter(pk=new.pk).update(created_at=YOUNG)

    assert retention_sweep(now=NOW)["commands"] == 1
    assert list(DaemonCommand.objects.values_list("pk", flat=True)) == [new.pk]


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
