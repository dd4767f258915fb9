"""Races the dispatch core must win, each forced into its worst interleaving with a
hook (lakeshore_admin.hooks) and a second connection, with a negative control showing
that the old way loses: a claim against a drop, a heartbeat, a second claim of the same
daemon and a scale-down; the reaper's rescue of what the old claim stranded; a
controller tick that fails after its launch."""

import contextlib
import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from accounts.models import ApiToken
from fleet import daemons, protocol
from fleet.driver_base import DRIVERS
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from lakeshore_admin import hooks
from tests.support import builders

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "lakeshore.functions.echo"

# The claim as it was before this change: nothing in it looks at the daemon again.
OLD_CLAIM_SQL = """
UPDATE jobs_invocation
   SET state = 'running', daemon_id = %(daemon)s, attempts = attempts + 1, started_at = now()
 WHERE id = ANY(ARRAY(
        SELECT id FROM jobs_invocation WHERE queue = %(queue)s AND state = 'queued'
         ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED))
"""


@pytest.fixture(autouse=True)
def _no_hooks_left():
    yield
    hooks.clear()


def _in_other_thread(action):
    """Run `action` on another thread (its own database connection) to completion."""
    errors = []

    def run():
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the other thread did not finish"
    if errors:
        raise errors[0]


def _running_on_dead_daemons() -> int:
    return Invocation.objects.filter(
        state="running", daemon__state__in=["terminated", "lost"]
    ).count()


def test_a_drop_between_the_liveness_check_and_the_claim_strands_nothing():
    builders.queue(name="w")
    inv, _ = services.invocation_submit(function=ECHO, queue="w")
    daemon = builders.daemon(queues=["w"])
    hooks.register(
        "claim.before_statement",
        lambda: _in_other_thread(
            lambda: daemons.daemon_drop(daemon=Daemon.objects.get(pk=daemon.pk))
        ),
    )

    claimed = builders.claim(daemon=daemon)  # it passed the check; then the drop

    assert claimed == []
    inv.refresh_from_db()
    assert (inv.state, inv.daemon_id) == ("queued", None)
    assert _running_on_dead_daemons() == 0


def test_negative_control_the_old_claim_after_that_drop_strands_the_invocation():
    builders.queue(name="w")
    services.invocation_submit(function=ECHO, queue="w")
    daemon = builders.daemon(queues=["w"])
    daemons.daemon_drop(daemon=daemon)  # the drop lands first; the old statement runs on
    with connection.cursor() as cursor:
        cursor.execute(OLD_CLAIM_SQL, {"daemon": daemon.pk, "queue": "w"})
    assert _running_on_dead_daemons() == 1


def test_a_drop_that_waits_for_a_claim_in_flight_ends_what_it_took():
    builders.queue(name="w")
    inv, _ = services.invocation_submit(function=ECHO, queue="w")
    daemon = builders.daemon(queues=["w"])
    drop = _BehindTheClaim(lambda: daemons.daemon_drop(daemon=Daemon.objects.get(pk=daemon.pk)))
    hooks.register("claim.before_commit", drop.start_and_see_it_wait)
    claimed = builders.claim(daemon=daemon)  # commits; the drop then goes on
    drop.join()

    assert drop.errors == []
    assert [i.pk for i in claimed] == [inv.pk]
    assert drop.result["terminated"] is True
    inv.refresh_from_db()
    assert (inv.state, inv.reason) == ("killed", "daemon removed")
    assert _running_on_dead_daemons() == 0


class _BehindTheClaim:
    """`action` on another thread (its own connection), started from a claim's hook and
    seen waiting on a lock the claim holds before the claim goes on to commit."""

    def __init__(self, action):
        self.result, self.errors = None, []
        self.thread = threading.Thread(target=self._run, args=(action,))

    def _run(self, action):
        try:
            self.result = action()
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            self.errors.append(exc)
        finally:
            connection.close()

    def start_and_see_it_wait(self):
        self.thread.start()
        try:
            _wait_until_blocked_on_a_lock()
        except AssertionError as exc:
            raise AssertionError(f"{exc} {self.result} {self.errors}") from None

    def join(self):
        self.thread.join(30)
        assert not self.thread.is_alive(), "the other thread did not finish"


def _wait_until_blocked_on_a_lock(timeout: float = 10.0):
    """Until another backend of this database waits on a lock (the drop, queued behind
    the claim's lock on the daemon's row)."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            # inside a transaction, statistics views keep their first snapshot: drop it
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.02)
        cursor.execute(
            "SELECT pid, state, wait_event_type, wait_event, left(query, 60) "
            "FROM pg_stat_activity WHERE datname = current_database()"
        )
        seen = cursor.fetchall()
    raise AssertionError(f"the drop never waited for the claim: {seen}")


def test_the_reaper_rescues_work_left_running_on_a_terminated_daemon():
    builders.queue(name="w")
    again, _ = services.invocation_submit(function=ECHO, queue="w", max_attempts=2)
    last, _ = services.invocation_submit(function=ECHO, queue="w", max_attempts=1)
    daemon = builders.daemon(queues=["w"])
    with connection.cursor() as cursor:  # strand both, as the old claim could
        for _ in range(2):
            cursor.execute(OLD_CLAIM_SQL, {"daemon": daemon.pk, "queue": "w"})
    Daemon.objects.filter(pk=daemon.pk).update(state="terminated")

    report = daemons.reap()

    again.refresh_from_db()
    last.refresh_from_db()
    assert (again.state, again.daemon_id) == ("queued", None)
    assert (last.state, last.error) == ("failed", "daemon gone")
    assert (report["requeued"], report["failed"]) == (1, 1)
    assert _running_on_dead_daemons() == 0


# ---------------------------------------------------------------------------- scale-down


def _pool_of_one_idle_daemon(settings):
    settings.LAKESHORE_STARTUP_GRACE = 0
    settings.LAKESHORE_SCALE_DOWN_WINDOW = 0
    builders.provider(name="sim", kind="simulated")
    queue = builders.queue(
        name="pool",
        provider="sim",
        elasticity_spec={"kind": "max_count", "max": 4},
    )
    builders.tick_queue(queue.pk)  # nothing queued: nothing launched
    inv, _ = services.invocation_submit(function=ECHO, queue="pool")
    builders.tick_queue(queue.pk)  # P=1: launch one
    daemon = Daemon.objects.get(queues=["pool"])
    builders.tick_queue(queue.pk)  # provisioning → idle (simulated start-up 0 s)
    daemon.refresh_from_db()
    assert daemon.state == "idle"
    services.invocation_kill(invocation_id=inv.pk)  # now the formula wants zero
    return queue, daemon


def test_scale_down_racing_a_claim_lets_the_claimed_job_complete(settings):
    queue, daemon = _pool_of_one_idle_daemon(settings)
    got = []

    def submit_and_claim():  # after the tick chose the idle daemon, before it acts
        services.invocation_submit(function=ECHO, queue="pool")
        got.extend(builders.claim(daemon=Daemon.objects.get(pk=daemon.pk)))

    hooks.register("scale_down.chosen", lambda: _in_other_thread(submit_and_claim))

    event = builders.tick_queue(queue.pk)

    assert len(got) == 1
    daemon.refresh_from_db()
    assert daemon.state == "busy"  # neither retired nor ended
    assert (event.action, event.delta) == ("tick_noop", 0)
    done = protocol.invocation_complete(
        daemon=daemon, invocation_id=got[0].pk, attempt=1, outcome="succeeded", result=1
    )
    assert done.state == "succeeded"


def test_negative_control_ending_the_chosen_daemon_outright_kills_the_claimed_job(settings):
    queue, daemon = _pool_of_one_idle_daemon(settings)
    job, _ = services.invocation_submit(function=ECHO, queue="pool")
    builders.claim(daemon=daemon)  # claimed after the old code chose it
    daemons.daemon_drop(daemon=daemon)  # the old scale-down: terminate the chosen one
    job.refresh_from_db()
    assert job.state == "killed"


def test_scale_down_ends_an_idle_daemon_and_revokes_its_token(settings):
    queue, daemon = _pool_of_one_idle_daemon(settings)
    token, _ = _minted_token_for(daemon)

    event = builders.tick_queue(queue.pk)

    daemon.refresh_from_db()
    token.refresh_from_db()
    assert (event.action, event.delta, daemon.state) == ("scale_down", -1, "terminated")
    assert token.revoked_at is not None


def _minted_token_for(daemon):
    return builders.credential(daemon)


# ---------------------------------------------------------------------------- side effects


def test_a_tick_that_raises_after_launching_leaves_no_process_and_no_live_token(settings):
    local = DRIVERS["local"]
    builders.provider(name="here", kind="local")
    queue = builders.queue(
        name="grow", provider="here", elasticity_spec={"kind": "fixed", "min": 2}
    )
    before = dict(local.processes)
    started = []
    real_start = local._start
    local._start = lambda *a, **k: started.append(a) or real_start(*a, **k)

    def boom():
        raise RuntimeError("the tick fails after its launch")

    hooks.register("tick.acted", boom)
    try:
        with pytest.raises(RuntimeError, match="after its launch"):
            builders.tick_queue(queue.pk)
    finally:
        local._start = real_start

    assert started == []  # no process was ever started
    assert local.processes == before
    assert not Daemon.objects.filter(queues=["grow"]).exists()
    assert not ApiToken.objects.usable().filter(user__username="provider-here").exists()


def test_negative_control_a_launch_that_commits_starts_its_processes(settings):
    local = DRIVERS["local"]
    builders.provider(name="here", kind="local")
    queue = builders.queue(
        name="grow", provider="here", elasticity_spec={"kind": "fixed", "min": 1}
    )
    started = []
    real_start = local._start
    local._start = lambda daemon, *rest: started.append(daemon.pk)  # no real process
    try:
        builders.tick_queue(queue.pk)
    finally:
        local._start = real_start
    assert started == list(Daemon.objects.filter(queues=["grow"]).values_list("pk", flat=True))


def test_two_claims_of_one_daemon_at_once_do_not_deadlock():
    """Both claims are in their transaction when their touches (busy/idle) would write
    the daemon's row. Forced: each waits at the touch until the other is there too, or
    until it is clear the other cannot get there (it waits for this one's lock). With
    share locks both got there, then each waited for the other's lock: PostgreSQL broke
    the deadlock by failing one (negative control: FOR SHARE in the claim fails this)."""
    builders.queue(name="w")
    ids = [services.invocation_submit(function=ECHO, queue="w")[0].pk for _ in range(2)]
    daemon = builders.daemon(queues=["w"])  # no heartbeat yet: both claims touch
    both_there = threading.Barrier(2)

    def meet_at_the_touch():
        # a broken barrier: the other one waits for this claim's lock; go on and commit
        with contextlib.suppress(threading.BrokenBarrierError):
            both_there.wait(timeout=3)

    results, errors = {}, []

    def claim(name):
        try:
            got = builders.claim(daemon=Daemon.objects.get(pk=daemon.pk))
            results[name] = [inv.pk for inv in got]
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)
        finally:
            connection.close()

    hooks.register("claim.before_touch", meet_at_the_touch)
    try:
        threads = [threading.Thread(target=claim, args=(n,)) for n in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        hooks.clear()

    assert errors == []
    assert sorted(results["a"] + results["b"]) == ids  # each took one, none twice
    assert Daemon.objects.get(pk=daemon.pk).state == "busy"


def _heartbeat_during_a_claim_of_a_busy_daemon():
    """A daemon still marked busy from its last job (it runs nothing) claims a new one;
    its heartbeat arrives while the claim holds the daemon's row and commits under it.
    Forced: the heartbeat starts at the claim's commit and is seen waiting on the lock."""
    builders.queue(name="w")
    inv, _ = services.invocation_submit(function=ECHO, queue="w")
    # its heartbeat is fresh: the claim writes nothing of its row, only locks it
    daemon = builders.daemon(queues=["w"], state="busy", last_heartbeat_at=timezone.now())
    beat = _BehindTheClaim(
        lambda: daemons.daemon_heartbeat(daemon=Daemon.objects.get(pk=daemon.pk))
    )
    hooks.register("claim.before_commit", beat.start_and_see_it_wait)
    claimed = builders.claim(daemon=daemon)
    beat.join()
    assert beat.errors == []
    assert [i.pk for i in claimed] == [inv.pk]
    return Daemon.objects.get(pk=daemon.pk).state


def test_a_heartbeat_that_waits_on_a_claim_sees_what_it_took():
    assert _heartbeat_during_a_claim_of_a_busy_daemon() == "busy"


def test_negative_control_a_touch_in_one_statement_writes_idle_under_the_claimed_job(
    monkeypatch,
):
    def touch_in_one_statement(daemon_id, **_):  # its snapshot predates the claim's commit
        with connection.cursor() as cursor:
            cursor.execute(daemons._TOUCH_SQL, daemons.touch_params(daemon_id))

    monkeypatch.setattr(daemons, "touch", touch_in_one_statement)
    assert _heartbeat_during_a_claim_of_a_busy_daemon() == "idle"
