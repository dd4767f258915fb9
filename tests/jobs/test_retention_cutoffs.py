"""Retention, what goes: finished invocations, queue events, result frames, samples,
the audit trail and daemon commands older than their cutoff (LAKESHORE_RETENTION_DAYS
or their own), read from the settings; what stays: the young, the unfinished, what a
daemon still runs, a retry of a deleted invocation; on the real database."""

import runpy
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, models
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import AuditEvent
from fleet import orders
from fleet.models import Daemon, DaemonCommand
from jobs import services
from jobs.models import TERMINAL_STATES, Invocation, InvocationState, JobLog, LogChunk, ResultFrame
from jobs.retention import retention_sweep
from queues.models import QueueEvent, QueueSample
from tests.jobs.retention_rows import NOW, OLD, YOUNG, _deletes, _events, _ids, _invocations
from tests.support import builders

pytestmark = pytest.mark.django_db


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


def test_daemon_commands_go_with_the_invocations_age():

    builders.queue(name="q")
    daemon = builders.daemon(queues=["q"])
    inv = _invocations(1)[0]
    old = orders.command_add(daemon=daemon, invocation=inv, verb="kill", signal="KILL", by="x")
    new = orders.command_add(daemon=daemon, invocation=inv, verb="kill", signal="KILL", by="y")
    DaemonCommand.objects.filter(pk=old.pk).update(created_at=OLD)
    DaemonCommand.objects.filter(pk=new.pk).update(created_at=YOUNG)

    assert retention_sweep(now=NOW)["commands"] == 1
    assert list(DaemonCommand.objects.values_list("pk", flat=True)) == [new.pk]


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
