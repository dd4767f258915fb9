"""The job state machine, cell by cell: every action from every state, through the real
functions of jobs/transitions/ and the services that own the rules around them.

A row is a transition, a column the state the invocation is in. A cell says what comes
of it: a state (the row moves there), NO (refused: the function answers False, 0, None
or nothing), E_… (refused with a Conflict of that code), NEW (retry: the row stays as it
is and a new queued invocation retries it), KEPT (a report after a kill: the state
stays, the outcome the report brought is kept as discarded). Every refusal leaves the
row as it was, and nothing leaves a terminal state. Submit (nothing → queued) has its
own test below.

The predicates of Invocation (is_finished, is_active, can_kill, can_stop, can_retry)
are checked against the same table, so they cannot drift from what the functions do."""

import contextlib
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from unittest import mock

import pytest
from django.conf import settings
from django.db import models
from django.utils import timezone

from fleet import daemons, orders
from jobs import services, transitions
from jobs.models import (
    ACTIVE_STATES,
    KILLABLE_STATES,
    RETRYABLE_STATES,
    STOPPABLE_STATES,
    TERMINAL_STATES,
    Invocation,
    InvocationState,
)
from jobs.transitions import completion, rescue
from lakeshore_admin.errors import Conflict
from queues import services as queue_services
from tests.support import builders

pytestmark = pytest.mark.django_db

Q, R, S, F, K, T = (
    InvocationState.QUEUED,
    InvocationState.RUNNING,
    InvocationState.SUCCEEDED,
    InvocationState.FAILED,
    InvocationState.KILLED,
    InvocationState.TIMEOUT,
)
STATES = (Q, R, S, F, K, T)


@dataclass(frozen=True)
class Refused:
    code: str | None = None  # the Conflict's code; None: a falsy answer, no error


NO = Refused()
E_RUN = Refused("invocation_running")  # jobs kill of a running job: stop it on its daemon
E_END = Refused("invocation_finished")
E_IDLE = Refused("invocation_not_running")
E_INUSE = Refused("queue_in_use")
E_NORETRY = Refused("invocation_not_retryable")
NEW = "a new queued invocation retries it"
KEPT = "the state stays; the outcome the report brought is kept as discarded"

# resubmit        services.invocation_submit with the row's key: the row comes back
# claim           builders.claim (fleet/protocol.claim_steps) by a daemon of its queue
# succeed, fail-retry, fail-last, report-timeout
#                 completion.complete by its daemon, for its attempt (fail-retry: with
#                 an attempt left; fail-last: none left)
# late-report     completion.record_discarded_outcome: its daemon reports its attempt
#                 succeeded after complete refused it (a kill came first)
# overdue         completion.timeout_overdue (the reaper): past its timeout_s
# unheld          rescue.release_unheld (a heartbeat): its daemon does not hold it
# leave-*         fleet.daemons.daemon_deregister: its daemon leaves (attempt left/none)
# lost-*          daemons.reap: its daemon went silent past the heartbeat timeout
# drop            fleet.daemons.daemon_drop: an operator drops its daemon
# exec-kill       orders.daemon_exec kill on its daemon (console: Stop on daemon)
# kill            services.invocation_kill (jobs kill)
# bulk-cancel     services.invocation_bulk_cancel of its queue
# queue-remove    queues.services.queue_delete of its queue, with force
# bulk-cancel-search  services.invocation_bulk_cancel of its queue, with a search
# retry           services.invocation_retry (jobs retry)
# bulk-retry      services.invocation_bulk_retry of its queue (jobs retry --state …)
# fmt: off
TABLE = {
    # action           queued     running    succeeded  failed     killed     timeout
    "resubmit":       (NO,        NO,        NO,        NO,        NO,        NO),
    "claim":          (R,         NO,        NO,        NO,        NO,        NO),
    "succeed":        (NO,        S,         NO,        NO,        NO,        NO),
    "fail-retry":     (NO,        Q,         NO,        NO,        NO,        NO),
    "fail-last":      (NO,        F,         NO,        NO,        NO,        NO),
    "report-timeout": (NO,        T,         NO,        NO,        NO,        NO),
    "late-report":    (NO,        NO,        NO,        NO,        KEPT,      NO),
    "overdue":        (NO,        T,         NO,        NO,        NO,        NO),
    "unheld":         (NO,        Q,         NO,        NO,        NO,        NO),
    "leave-retry":    (NO,        Q,         NO,        NO,        NO,        NO),
    "leave-last":     (NO,        F,         NO,        NO,        NO,        NO),
    "lost-retry":     (NO,        Q,         NO,        NO,        NO,        NO),
    "lost-last":      (NO,        F,         NO,        NO,        NO,        NO),
    "drop":           (NO,        K,         NO,        NO,        NO,        NO),
    "exec-kill":      (E_IDLE,    K,         E_IDLE,    E_IDLE,    E_IDLE,    E_IDLE),
    "kill":           (K,         E_RUN,     E_END,     E_END,     E_END,     E_END),
    "bulk-cancel":    (K,         NO,        NO,        NO,        NO,        NO),
    "bulk-cancel-search": (K,     NO,        NO,        NO,        NO,        NO),
    "queue-remove":   (K,         E_INUSE,   NO,        NO,        NO,        NO),
    "retry":          (E_NORETRY, E_NORETRY, E_NORETRY, NEW,       NEW,       NEW),
    "bulk-retry":     (NO,        NO,        NO,        NEW,       NEW,       NEW),
}
# fmt: on


def _moves(outcome) -> bool:
    """Whether the cell changes the row's state."""
    return outcome in STATES


def _allowed(outcome) -> bool:
    return not isinstance(outcome, Refused)


# ---------------------------------------------------------------------------- builders

LATER = timedelta(seconds=settings.LAKESHORE_HEARTBEAT_TIMEOUT + 60)


def _daemon(queue: str):
    return builders.daemon(queues=[queue], last_heartbeat_at=timezone.now())


def _its_daemon(inv: Invocation):
    """The daemon that ran it, or (never claimed) a live daemon of its queue."""
    return inv.daemon if inv.daemon_id else _daemon(inv.queue)


# ---------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Action:
    run: Callable[[Invocation], object]  # the call; its answer is falsy when it did nothing
    via: tuple[str, ...]  # the jobs.transitions functions that make the change
    max_attempts: int = 1  # the invocation's, when it is built
    timeout_s: int | None = None
    prepare: Callable[[Invocation], None] | None = None  # before the row is looked at


def _complete(outcome: str) -> Callable[[Invocation], object]:
    def run(inv):
        return completion.complete(
            daemon_id=_its_daemon(inv).pk,
            invocation_id=inv.pk,
            attempt=inv.attempts,
            outcome=outcome,
            result=None,
            error="" if outcome == "succeeded" else "boom",
        )

    return run


def _late_report(inv):
    return completion.record_discarded_outcome(
        daemon_id=_its_daemon(inv).pk,
        invocation_id=inv.pk,
        attempt=inv.attempts,
        outcome="succeeded",
    )


def _resubmit(inv):
    _, created = services.invocation_submit(function="x.y", queue=inv.queue, key=inv.key)
    return created


def _claim(inv):
    return builders.claim(daemon=_daemon(inv.queue))


def _overdue(inv):
    return completion.timeout_overdue(now=timezone.now() + timedelta(minutes=5))


def _claimed_a_minute_ago(inv):
    Invocation.objects.filter(pk=inv.pk).update(
        started_at=models.F("started_at") - timedelta(minutes=1)
    )


def _unheld(inv):
    return rescue.release_unheld(
        daemon_id=_its_daemon(inv).pk, held=[], grace=daemons.CLAIM_GRACE_SECONDS
    )


def _leave(inv):
    ended = daemons.daemon_deregister(daemon=_its_daemon(inv))
    return ended["requeued"] + ended["ended"]


def _lost(inv):
    _its_daemon(inv)  # a queued one's queue has a daemon too: it goes lost all the same
    report = daemons.reap(now=timezone.now() + LATER)
    assert report["lost"] == 1
    return report["requeued"] + report["failed"] + report["timeout"]


def _drop(inv):
    return daemons.daemon_drop(daemon=_its_daemon(inv))["ended"]


def _exec_kill(inv):
    return orders.daemon_exec(daemon=_its_daemon(inv), verb="kill", invocation_id=inv.pk)


def _kill(inv):
    return services.invocation_kill(invocation_id=inv.pk)


def _bulk_cancel(inv):
    return services.invocation_bulk_cancel(queue=inv.queue)


def _bulk_cancel_search(inv):
    return services.invocation_bulk_cancel(queue=inv.queue, search=inv.function)


def _bulk_retry(inv):
    return services.invocation_bulk_retry(states=RETRYABLE_STATES, queue=inv.queue)["retried"]


def _queue_remove(inv):
    return queue_services.queue_delete(name=inv.queue, force=True)["killed"]


def _retry(inv):
    return services.invocation_retry(invocation_id=inv.pk)


COMPLETE = ("complete", "complete_many")
ACTIONS = {
    "resubmit": Action(_resubmit, via=("insert_if_admitted",)),
    "claim": Action(_claim, via=("claim",)),
    "succeed": Action(_complete("succeeded"), via=COMPLETE),
    "fail-retry": Action(_complete("failed"), via=COMPLETE, max_attempts=2),
    "fail-last": Action(_complete("failed"), via=COMPLETE),
    "report-timeout": Action(_complete("timeout"), via=COMPLETE),
    "late-report": Action(_late_report, via=("record_discarded_outcome",)),
    "overdue": Action(_overdue, via=("timeout_overdue",), timeout_s=1),
    "unheld": Action(_unheld, via=("release_unheld",), prepare=_claimed_a_minute_ago),
    "leave-retry": Action(_leave, via=("requeue_daemon_work",), max_attempts=2),
    "leave-last": Action(_leave, via=("requeue_daemon_work",)),
    "lost-retry": Action(_lost, via=("rescue_orphans",), max_attempts=2),
    "lost-last": Action(_lost, via=("rescue_orphans",)),
    "drop": Action(_drop, via=("kill_daemon_work",)),
    "exec-kill": Action(_exec_kill, via=("kill_running",)),
    "kill": Action(_kill, via=("kill_queued",)),
    "bulk-cancel": Action(_bulk_cancel, via=("kill_queued_in_batches",)),
    "bulk-cancel-search": Action(_bulk_cancel_search, via=("kill_queued_ids",)),
    "queue-remove": Action(_queue_remove, via=("kill_queued_of_queue",)),
    "retry": Action(_retry, via=("insert_if_admitted",)),
    "bulk-retry": Action(_bulk_retry, via=("insert_retries",)),
}
SUBMIT_VIA = ("insert_if_admitted", "insert_queued")
READERS = {"any_queued", "already_recorded"}  # functions of transitions that change nothing

# Every module of the jobs.transitions package that changes state (all but `states`, the
# state names and the statement runner), and the module of each of its functions.
MODULES = [
    importlib.import_module(f"{transitions.__name__}.{found.name}")
    for found in pkgutil.iter_modules(transitions.__path__)
    if found.name != "states"
]
HOME = {
    name: module
    for module in MODULES
    for name, function in inspect.getmembers(module, inspect.isfunction)
    if function.__module__ == module.__name__ and not name.startswith("_")
}


@contextlib.contextmanager
def _spies(names):
    """The named functions of jobs.transitions, still working, watched."""
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(
                mock.patch.object(HOME[name], name, wraps=getattr(HOME[name], name))
            )
            for name in names
        }


def _row(pk: int) -> dict:
    return Invocation.objects.filter(pk=pk).values().get()


CELLS = [
    pytest.param(name, state, outcome, id=f"{name}-from-{state}")
    for name, row in TABLE.items()
    for state, outcome in zip(STATES, row, strict=True)
]


# ---------------------------------------------------------------------------- the walk


@pytest.mark.parametrize(("name", "state", "outcome"), CELLS)
def test_each_action_from_each_state(name, state, outcome):
    action = ACTIONS[name]
    inv = builders.invocation(state, max_attempts=action.max_attempts, timeout_s=action.timeout_s)
    if action.prepare is not None:
        action.prepare(inv)
    before, count = _row(inv.pk), Invocation.objects.count()
    code = None
    with _spies(action.via) as spies:
        try:
            answer = action.run(inv)
        except Conflict as exc:
            answer, code = None, exc.code
    after = _row(inv.pk)

    if isinstance(outcome, Refused):
        assert (code, bool(answer)) == (outcome.code, False)
        assert after == before
        assert Invocation.objects.count() == count
        return
    assert code is None and answer
    assert all(spy.called for spy in spies.values()), spies
    if outcome == KEPT:
        assert (after["discarded_outcome"], after["state"]) == ("succeeded", state)
        assert before["discarded_at"] is None and after["discarded_at"] is not None
        kept = {"discarded_outcome", "discarded_at"}
        assert {k: v for k, v in after.items() if k not in kept} == {
            k: v for k, v in before.items() if k not in kept
        }
        return
    if outcome == NEW:
        assert after == before  # the ended one keeps its record
        new = Invocation.objects.get(retry_of=inv.pk)
        assert (new.state, new.attempts, new.function) == (Q, 0, inv.function)
        return
    assert after["state"] == outcome
    assert Invocation.objects.count() == count
    assert (after["finished_at"] is None) == (outcome in ACTIVE_STATES)


def test_a_second_retry_is_refused_and_changes_nothing():
    inv = builders.invocation(F)
    first = services.invocation_retry(invocation_id=inv.pk)
    before, count = _row(inv.pk), Invocation.objects.count()
    with pytest.raises(Conflict) as refused:
        services.invocation_retry(invocation_id=inv.pk)
    assert refused.value.code == "already_retried"
    assert (_row(inv.pk), Invocation.objects.count()) == (before, count)
    assert _row(first.pk)["state"] == Q


def test_submit_makes_a_queued_invocation_one_way_or_the_other():
    queue = builders.queue().name
    with _spies(SUBMIT_VIA) as spies:
        one, created = services.invocation_submit(function="x.y", queue=queue)
        [(two, created_too)] = services.invocation_submit_batch(
            [{"function": "x.y", "queue": queue}]
        )
    assert created and created_too
    assert [_row(one.pk)["state"], _row(two.pk)["state"]] == [Q, Q]
    assert all(spy.called for spy in spies.values())


# ---------------------------------------------------------------------------- the table


def test_the_table_has_a_cell_for_every_action_and_state():
    assert set(TABLE) == set(ACTIONS)
    assert set(STATES) == set(InvocationState)


def test_the_table_walks_every_state_change_of_transitions():
    """A function added to jobs/transitions/ fails this until the table walks it."""
    public = set(HOME)
    walked = {name for action in ACTIONS.values() for name in action.via} | set(SUBMIT_VIA)
    assert walked == public - READERS


@pytest.mark.parametrize("state", TERMINAL_STATES)
def test_nothing_leaves_a_terminal_state(state):
    column = [row[STATES.index(state)] for row in TABLE.values()]
    assert not any(_moves(outcome) for outcome in column)


@pytest.mark.parametrize("state", [Q, R])
def test_an_active_state_has_a_way_out(state):
    column = [row[STATES.index(state)] for row in TABLE.values()]
    assert any(_moves(outcome) and outcome != state for outcome in column)


# ---------------------------------------------------------------------------- predicates


@pytest.mark.parametrize("state", STATES)
def test_the_predicates_say_what_the_table_does(state):
    inv = builders.invocation(state)
    column = {name: row[STATES.index(state)] for name, row in TABLE.items()}
    moves = any(_moves(outcome) for outcome in column.values())
    assert inv.is_active == moves
    assert inv.is_finished == (not moves)
    assert inv.can_kill == _allowed(column["kill"])
    assert inv.can_stop == _allowed(column["exec-kill"])
    assert inv.can_retry == _allowed(column["retry"])
    assert inv.is_succeeded == (state == S)


def test_the_state_sets_partition_the_states():
    assert set(ACTIVE_STATES).isdisjoint(TERMINAL_STATES)
    assert set(ACTIVE_STATES) | set(TERMINAL_STATES) == set(InvocationState)
    assert set(KILLABLE_STATES) | set(STOPPABLE_STATES) <= set(ACTIVE_STATES)
    assert set(RETRYABLE_STATES) <= set(TERMINAL_STATES)


def test_a_running_invocation_whose_daemon_row_is_gone_cannot_be_stopped():
    """can_stop needs the daemon to send the order to (deleting it clears daemon_id)."""
    assert Invocation(state=R, daemon_id=None).can_stop is False
    assert Invocation(state=R, daemon_id=1).can_stop is True
