"""The state names the state machine's statements take (as parameters, never as
strings inside SQL), and running a statement with them."""

from django.db import connection

from fleet.models import CLAIMING_DAEMON_STATES, LIVE_DAEMON_STATES, DaemonState
from jobs.models import TERMINAL_STATES, InvocationState
from queues.models import DISPATCHING_QUEUE_STATES

QUEUED = InvocationState.QUEUED.value
RUNNING = InvocationState.RUNNING.value
SUCCEEDED = InvocationState.SUCCEEDED.value
FAILED = InvocationState.FAILED.value
KILLED = InvocationState.KILLED.value
TIMEOUT = InvocationState.TIMEOUT.value
TERMINAL = [str(state) for state in TERMINAL_STATES]

_STATES = {
    "queued": QUEUED,
    "running": RUNNING,
    "succeeded": SUCCEEDED,
    "failed": FAILED,
    "killed": KILLED,
    "timeout": TIMEOUT,
    "claiming": [str(s) for s in CLAIMING_DAEMON_STATES],
    "live": [str(s) for s in LIVE_DAEMON_STATES],
    "dispatching": [str(s) for s in DISPATCHING_QUEUE_STATES],
    "busy": DaemonState.BUSY.value,
}


def _execute(sql: str, params: dict) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, {**_STATES, **params})
        return cursor.fetchall() if cursor.description else []


def _rowcount(sql: str, params: dict) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, {**_STATES, **params})
        return cursor.rowcount
