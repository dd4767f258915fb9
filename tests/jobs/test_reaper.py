from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from fleet import daemons, protocol
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from lakeshore_admin.errors import Conflict
from tests.support import builders

pytestmark = pytest.mark.django_db


def _running(max_attempts=1, timeout_s=None):
    builders.queue(name="w")
    inv, _ = services.invocation_submit(
        function="x.y", queue="w", max_attempts=max_attempts, timeout_s=timeout_s
    )
    daemon = builders.daemon(queues=["w"], last_heartbeat_at=timezone.now())
    (claimed,) = builders.claim(daemon=daemon)
    assert claimed.pk == inv.pk
    return daemon, claimed


def _later(seconds):
    return timezone.now() + timedelta(seconds=seconds)


def test_it_leaves_a_daemon_that_heartbeats_alone():
    daemon, inv = _running()
    assert daemons.reap(now=_later(settings.LAKESHORE_HEARTBEAT_TIMEOUT - 5))["lost"] == 0
    daemon.refresh_from_db()
    assert daemon.state == "busy"


def test_it_requeues_the_work_of_a_lost_daemon_while_attempts_remain():
    daemon, inv = _running(max_attempts=2)
    report = daemons.reap(now=_later(settings.LAKESHORE_HEARTBEAT_TIMEOUT + 1))
    assert report["lost"] == 1 and report["requeued"] == 1
    daemon.refresh_from_db()
    inv.refresh_from_db()
    assert daemon.state == "lost"
    assert (inv.state, inv.daemon_id) == ("queued", None)
    assert inv.attempts == 1


def test_it_fails_the_work_of_a_lost_daemon_without_attempts_left():
    daemon, inv = _running(max_attempts=1)
    report = daemons.reap(now=_later(settings.LAKESHORE_HEARTBEAT_TIMEOUT + 1))
    assert report["failed"] == 1
    inv.refresh_from_db()
    assert inv.state == "failed" and inv.error == "daemon gone (lost: no heartbeat)"


def test_a_stale_completion_after_a_reap_changes_nothing():
    daemon, inv = _running(max_attempts=2)
    daemons.reap(now=_later(settings.LAKESHORE_HEARTBEAT_TIMEOUT + 1))
    before = Invocation.objects.filter(pk=inv.pk).values().get()
    with pytest.raises(Conflict):
        protocol.invocation_complete(
            daemon=daemon, invocation_id=inv.pk, attempt=1, succeeded=True, result=1
        )
    assert Invocation.objects.filter(pk=inv.pk).values().get() == before


def test_a_completion_for_an_older_attempt_is_refused():
    daemon, inv = _running(max_attempts=2)
    daemons.reap(now=_later(settings.LAKESHORE_HEARTBEAT_TIMEOUT + 1))
    other = builders.daemon(queues=["w"])
    (again,) = builders.claim(daemon=other)
    assert again.attempts == 2
    with pytest.raises(Conflict):
        protocol.invocation_complete(daemon=other, invocation_id=inv.pk, attempt=1, succeeded=True)
    done = protocol.invocation_complete(
        daemon=other, invocation_id=inv.pk, attempt=2, succeeded=True, result={"ok": True}
    )
    assert done.state == "succeeded" and done.result == {"ok": True}


def test_it_times_out_invocations_past_their_timeout():
    daemon, inv = _running(timeout_s=30)
    assert daemons.reap(now=_later(10))["timeout"] == 0
    assert daemons.reap(now=_later(31))["timeout"] == 1
    inv.refresh_from_db()
    assert inv.state == "timeout" and inv.finished_at is not None


def test_terminal_states_never_change():
    daemon, inv = _running()
    protocol.invocation_complete(daemon=daemon, invocation_id=inv.pk, attempt=1, succeeded=True)
    daemons.reap(now=_later(settings.LAKESHORE_HEARTBEAT_TIMEOUT + 100))
    with pytest.raises(Conflict):
        services.invocation_kill(invocation_id=inv.pk)
    assert services.invocation_bulk_cancel() == 0
    inv.refresh_from_db()
    assert inv.state == "succeeded"


def test_running_it_twice_at_once_is_harmless():
    daemon, inv = _running(max_attempts=3)
    now = _later(settings.LAKESHORE_HEARTBEAT_TIMEOUT + 1)
    first = daemons.reap(now=now)
    second = daemons.reap(now=now)
    assert first["requeued"] == 1 and second == {
        "lost": 0,
        "requeued": 0,
        "failed": 0,
        "timeout": 0,
    }
    assert Daemon.objects.get(pk=daemon.pk).state == "lost"
