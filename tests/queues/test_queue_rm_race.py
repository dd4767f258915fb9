"""Issue 17: `queue rm` and claims see each other. A claim holds its queue's row with a
key share, and removal locks that row for update, so neither can slip past the other:
a removal behind a claim sees the work it took running and refuses (queue_in_use); a
claim behind a removal finds no queue and takes nothing. Each interleaving is forced
with a hook point (lakeshore_admin.hooks) and a second connection; the negative
controls run the claim statement without its lock and strand a running invocation in
a queue that no longer exists."""

import re
import threading
import time

import pytest
from django.db import connection

from fleet import protocol
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from jobs.transitions import claim
from lakeshore_admin import hooks
from lakeshore_admin.errors import Conflict
from queues import services as queue_services
from queues.models import Queue
from tests.support import builders

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.security]

ECHO = "lakeshore.functions.echo"
LOCK = re.compile(r"\s+FOR KEY SHARE")


@pytest.fixture(autouse=True)
def _no_hooks_left():
    yield
    hooks.clear()
    protocol.forget_queue_rows()


@pytest.fixture
def unlocked_claim(monkeypatch):
    """The claim as it was before issue 17: it reads the queue's row without a lock."""
    unlocked, found = LOCK.subn("", claim._CLAIM_SQL)
    assert found == 1
    monkeypatch.setattr(claim, "_CLAIM_SQL", unlocked)


class _Other:
    """`action` on another thread, with its own database connection."""

    def __init__(self, action):
        self.result, self.errors = None, []
        self.thread = threading.Thread(target=self._run, args=(action,))
        self.thread.start()

    def _run(self, action):
        try:
            self.result = action()
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            self.errors.append(exc)
        finally:
            connection.close()

    def wait_until_blocked_on_a_lock(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        with connection.cursor() as cursor:
            while time.monotonic() < deadline and self.thread.is_alive():
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                )
                if cursor.fetchone()[0]:
                    return
                time.sleep(0.02)
        raise AssertionError(f"never waited on a lock: {self.result} {self.errors}")

    def join(self):
        self.thread.join(30)
        assert not self.thread.is_alive(), "the other thread did not finish"


def _stranded() -> list[Invocation]:
    """Running invocations whose queue no longer exists."""
    return list(
        Invocation.objects.filter(state="running")
        .exclude(queue="")
        .exclude(queue__in=Queue.objects.values("name"))
    )


def _rm_behind_a_claim():
    """A claim takes the queue's one invocation; before it commits, `queue rm --force`
    starts and waits on a lock the claim holds; then the claim commits."""
    builders.queue(name="w")
    inv, _ = services.invocation_submit(function=ECHO, queue="w")
    daemon = builders.daemon(queues=["w"])
    rm = []

    def start_rm():
        rm.append(_Other(lambda: queue_services.queue_delete(name="w", force=True)))
        rm[0].wait_until_blocked_on_a_lock()

    hooks.register("claim.before_commit", start_rm)
    claimed = builders.claim(daemon=daemon)
    rm[0].join()
    assert [i.pk for i in claimed] == [inv.pk]
    return inv, rm[0]


def test_a_removal_behind_a_claim_sees_the_work_running_and_refuses():
    inv, rm = _rm_behind_a_claim()

    assert len(rm.errors) == 1 and isinstance(rm.errors[0], Conflict)
    assert rm.errors[0].code == "queue_in_use" and rm.errors[0].extra == {"running": True}
    assert Queue.objects.filter(name="w").exists()
    inv.refresh_from_db()
    assert inv.state == "running" and _stranded() == []


@pytest.mark.usefixtures("unlocked_claim")
def test_negative_control_without_the_lock_the_removal_strands_the_claimed_work():
    inv, rm = _rm_behind_a_claim()

    assert rm.errors == [] and rm.result["deleted"] is True
    assert not Queue.objects.filter(name="w").exists()
    assert [i.pk for i in _stranded()] == [inv.pk]


def _claim_behind_a_removal():
    """`queue rm --force` has deleted the queue and not committed yet; a submit lands
    meanwhile (its queue still looks there) and a claim of a daemon serving this queue
    and another starts; the removal then commits."""
    builders.queue(name="w")
    builders.queue(name="other")
    daemon = builders.daemon(queues=["w", "other"])
    claim = []

    def late_submit_then_claim():
        late = _Other(lambda: Invocation.objects.create(function=ECHO, queue="w", state="queued"))
        late.join()
        assert late.errors == []
        claim.append(_Other(lambda: builders.claim(daemon=Daemon.objects.get(pk=daemon.pk))))
        claim[0].wait_until_blocked_on_a_lock()  # the daemon's row, which rm unbinds

    hooks.register("queue_remove.before_commit", late_submit_then_claim)
    assert queue_services.queue_delete(name="w", force=True)["deleted"] is True
    claim[0].join()
    assert claim[0].errors == []
    return claim[0].result


def test_a_claim_behind_a_removal_finds_no_queue_and_takes_nothing():
    assert _claim_behind_a_removal() == []
    assert _stranded() == []
    assert Invocation.objects.get(queue="w").state == "queued"  # the submit's own race


@pytest.mark.usefixtures("unlocked_claim")
def test_negative_control_without_the_lock_the_claim_takes_work_of_a_removed_queue():
    claimed = _claim_behind_a_removal()
    assert [i.queue for i in claimed] == ["w"]
    assert [i.pk for i in _stranded()] == [claimed[0].pk]
