"""The fast path of the daemon protocol and of submit (issue 8): how many statements
each costs, and that what it skips (a transaction, a queue lookup) changes no rule."""

import ast
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import protocol
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from jobs.transitions import states
from lakeshore_admin import hooks
from lakeshore_admin.errors import BacklogFull, Conflict, NotFound
from queues import services as queue_services
from tests.support import builders

pytestmark = pytest.mark.django_db

ECHO = "lakeshore.functions.echo"


def _statements(call):
    with CaptureQueriesContext(connection) as ctx:
        answer = call()
    return answer, [_sent(q["sql"]) for q in ctx.captured_queries]


def _sent(logged: str) -> str:
    """The statement as written: Django logs a prepared one (bound by the server) as
    'QUERY = <its text> - PARAMS = <its parameters>'."""
    if logged.startswith("QUERY = "):
        return ast.literal_eval(logged[len("QUERY = ") : logged.rindex(" - PARAMS = ")])
    return logged


def _work(sql: list[str]) -> list[str]:
    """The statements that are not transaction control (BEGIN, SAVEPOINT, COMMIT…)."""
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK")
    return [q for q in sql if not q.lstrip().upper().startswith(control)]


def test_a_submit_into_an_open_queue_is_one_statement():
    builders.queue(name="open")
    (invocation, created), sql = _statements(
        lambda: services.invocation_submit(function=ECHO, queue="open", args=[1], key="k1")
    )
    assert created and invocation.state == "queued" and invocation.args == [1]
    assert len(sql) == 1 and sql[0].lstrip().startswith("INSERT INTO jobs_invocation")


def _prepared_inserts() -> list[tuple[int, int]]:
    """(generic plans, custom plans) of this session's prepared INSERTs of invocations."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s",
            ["%INSERT INTO jobs_invocation%"],
        )
        return cursor.fetchall()


def test_the_submit_insert_is_prepared_once_per_connection_and_used_again():
    builders.queue(name="open")
    assert _prepared_inserts() == []
    for n in range(3):
        services.invocation_submit(function=ECHO, queue="open", args=[n])
    [(generic, custom)] = _prepared_inserts()  # one statement, not one a call
    assert generic + custom == 3


def test_preparing_one_statement_leaves_the_connection_preparing_nothing_else():
    builders.queue(name="open")
    services.invocation_submit(function=ECHO, queue="open", args=[1])
    assert connection.connection.prepare_threshold is None  # as Django set it
    for _ in range(3):  # an ORM statement, again and again: never prepared
        assert Invocation.objects.filter(queue="open").count() == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone() == (1,)


def test_a_prepared_insert_outlives_a_savepoint_rolled_back_after_it():
    builders.queue(name="open")
    services.invocation_submit(function=ECHO, queue="open", args=[1])
    with pytest.raises(RuntimeError), transaction.atomic():  # a savepoint: the test's
        services.invocation_submit(function=ECHO, queue="open", args=[2])
        raise RuntimeError
    services.invocation_submit(function=ECHO, queue="open", args=[3])
    [(generic, custom)] = _prepared_inserts()  # still the one statement, used 3 times
    assert generic + custom == 3
    assert sorted(i.args for i in Invocation.objects.filter(queue="open")) == [[1], [3]]


def test_negative_control_with_prepared_statements_off_the_insert_is_sent_plain(settings):
    settings.LAKESHORE_DB_PREPARED = False  # behind a pooler that cannot keep them
    builders.queue(name="open")
    for n in range(3):
        services.invocation_submit(function=ECHO, queue="open", args=[n])
    assert _prepared_inserts() == []
    assert Invocation.objects.filter(queue="open").count() == 3


def test_the_slow_path_still_answers_what_the_fast_one_cannot():
    builders.queue(name="open")
    first, _ = services.invocation_submit(function=ECHO, queue="open", key="same")
    again, created = services.invocation_submit(function=ECHO, queue="open", key="same")
    assert (again.pk, created) == (first.pk, False)
    with pytest.raises(NotFound):
        services.invocation_submit(function=ECHO, queue="nowhere")
    builders.queue(name="closed")
    queue_services.queue_transition(name="closed", action="archive")
    with pytest.raises(Conflict) as refused:
        services.invocation_submit(function=ECHO, queue="closed")
    assert refused.value.code == "queue_not_admitting"
    builders.queue(name="bounded", max_depth=1)
    services.invocation_submit(function=ECHO, queue="bounded")
    with pytest.raises(BacklogFull):
        services.invocation_submit(function=ECHO, queue="bounded", block_timeout=0)


def test_a_warm_claim_is_one_statement_and_its_completion_writes_nothing_of_the_daemon():
    builders.queue(name="w")
    daemon = builders.daemon(queues=["w"], last_heartbeat_at=timezone.now())
    builders.claim(daemon=daemon)  # this process learns the queue's kind
    invocation, _ = services.invocation_submit(function=ECHO, queue="w")
    services.invocation_submit(function=ECHO, queue="w")  # a backlog

    claimed, sql = _statements(lambda: builders.claim(daemon=daemon))
    assert [i.pk for i in claimed] == [invocation.pk]
    # the claim: daemon liveness, queue state and marking the daemon busy all inside
    assert len(_work(sql)) == 1
    assert Daemon.objects.values_list("state", flat=True).get(pk=daemon.pk) == "busy"

    daemon.refresh_from_db()
    done, sql = _statements(
        lambda: protocol.invocation_complete(
            daemon=daemon, invocation_id=invocation.pk, attempt=1, outcome="succeeded"
        )
    )
    assert done.state == "succeeded"
    # the fenced update and a look at the queue (work is queued: the daemon's next claim
    # follows and says busy or idle), no write of the daemon's row
    assert [q.split()[0] for q in _work(sql)] == ["UPDATE", "SELECT"]
    assert "fleet_daemon" not in " ".join(sql)

    claimed, sql = _statements(lambda: builders.claim(daemon=daemon))
    assert len(claimed) == 1
    assert len(_work(sql)) == 1  # busy already: the claim writes nothing of the daemon


def test_a_paused_queue_dispatches_nothing_though_its_row_is_reused():
    builders.queue(name="p")
    daemon = builders.daemon(queues=["p"])
    assert builders.claim(daemon=daemon) == []  # the row is now reused
    queue_services.queue_transition(name="p", action="pause")
    invocation, _ = services.invocation_submit(function=ECHO, queue="p")  # paused admits

    assert builders.claim(daemon=daemon) == []

    queue_services.queue_transition(name="p", action="resume")
    assert [i.pk for i in builders.claim(daemon=daemon)] == [invocation.pk]


def test_negative_control_without_the_state_check_the_paused_queue_dispatches(monkeypatch):
    builders.queue(name="p")
    daemon = builders.daemon(queues=["p"])
    queue_services.queue_transition(name="p", action="pause")
    services.invocation_submit(function=ECHO, queue="p")
    monkeypatch.setitem(states.STATE_PARAMS, "dispatching", ["active", "draining", "paused"])
    assert len(builders.claim(daemon=daemon)) == 1


def test_a_claim_that_fails_after_its_statement_takes_nothing():
    """Claims and touch commit together: an error after the claim statement (the
    database going away, say) leaves the work queued, not held by a daemon that never
    got the answer."""
    builders.queue(name="w")
    daemon = builders.daemon(queues=["w"])
    invocation, _ = services.invocation_submit(function=ECHO, queue="w")

    def fail():
        raise ConnectionError("the database went away")

    hooks.register("claim.before_commit", fail)
    try:
        with pytest.raises(ConnectionError):
            builders.claim(daemon=daemon)
    finally:
        hooks.clear()

    invocation.refresh_from_db()
    assert (invocation.state, invocation.daemon_id, invocation.attempts) == ("queued", None, 0)


def test_an_empty_claim_touches_the_daemon_only_when_its_heartbeat_is_due():
    builders.queue(name="w")
    daemon = builders.daemon(queues=["w"], last_heartbeat_at=timezone.now())
    builders.claim(daemon=daemon)  # this process learns the queue's kind

    _, sql = _statements(lambda: builders.claim(daemon=daemon))
    assert len(_work(sql)) == 1  # the claim alone: nothing a touch would write

    old = timezone.now() - timedelta(minutes=5)
    Daemon.objects.filter(pk=daemon.pk).update(last_heartbeat_at=old)
    daemon.refresh_from_db()
    _, sql = _statements(lambda: builders.claim(daemon=daemon))
    # and the touch, which keeps it from being reaped (under the claim's lock on its row)
    assert len(_work(sql)) == 2
    daemon.refresh_from_db()
    assert daemon.last_heartbeat_at > old


def test_a_batch_of_fresh_outcomes_is_recorded_in_one_statement():
    builders.queue(name="w")
    daemon = builders.daemon(queues=["w"], last_heartbeat_at=timezone.now())
    for n in range(10):
        services.invocation_submit(function=ECHO, queue="w", args=[n], max_attempts=2)
    claimed = builders.claim(daemon=daemon, limit=10)
    daemon.refresh_from_db()  # busy, as a request would load it
    outcomes = [
        {"invocation": inv.pk, "attempt": 1, "state": "succeeded", "result": [inv.pk]}
        for inv in claimed[:8]
    ] + [
        {"invocation": inv.pk, "attempt": 1, "state": "failed", "error": "e", "retry": r}
        for inv, r in zip(claimed[8:], [True, False], strict=True)
    ]
    answers, sql = _statements(
        lambda: protocol.invocation_complete_batch(daemon=daemon, outcomes=outcomes)
    )
    assert [a["ok"] for a in answers] == [True] * 10
    assert [a["state"] for a in answers] == ["succeeded"] * 8 + ["queued", "failed"]
    # its UPDATE, and a look at the queue: two failures went back to it, so the daemon's
    # next claim follows and says busy or idle (no write of the daemon's row here)
    assert [q.split()[0] for q in _work(sql)] == ["UPDATE", "SELECT"]
    assert "UPDATE jobs_invocation" in _work(sql)[0]
