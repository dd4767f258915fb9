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

# What every statement of the state machine gets among its parameters: %(queued)s,
# %(claiming)s (the daemon states that may claim), %(dispatching)s (the queue states), ...
STATE_PARAMS = {
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


def execute(sql: str, params: dict) -> list[tuple]:
    """Runs `sql` with STATE_PARAMS and `params`: the rows it returns (none: [])."""
    with connection.cursor() as cursor:
        cursor.execute(sql, {**STATE_PARAMS, **params})
        return cursor.fetchall() if cursor.description else []


def rowcount(sql: str, params: dict) -> int:
    """Runs `sql` with STATE_PARAMS and `params`: how many rows it changed."""
    with connection.cursor() as cursor:
        cursor.execute(sql, {**STATE_PARAMS, **params})
        return cursor.rowcount
