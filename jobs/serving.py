"""Whether anything will run a queue's work: the one rule behind a submit's hint, the job
page's note and the controller's wake after a submit (issue 20).

A queue is served when a live daemon (provisioning, idle, busy or draining) subscribes to
it; the default queue ('') by a live daemon whose `queues` is empty. A queue that is not
served *starts* when the controller starts daemons for it (a provider, an elasticity
declaration, not archived: queues/models.STARTS_DAEMONS_SQL, the one statement of the
rule, which the controller's wake reads too). A submit into such a queue wakes the
controller at once instead of waiting for its next tick: after the submit commits it
sends `wake_wanted`, a Django signal that fleet (above this app: it may not be imported
here) listens for.
A submit into a queue that is neither served nor started says how to start a daemon.

The same SQL answers for one queue inside a submit's INSERT (RETURNING, no extra
statement) and for many queues in one query (a batch, the job page)."""

from dataclasses import dataclass

from django.db import connection, transaction
from django.dispatch import Signal

from fleet.models import LIVE_DAEMON_STATES, Daemon
from queues.models import STARTS_DAEMONS_SQL, Queue

_LIVE = (
    f"EXISTS (SELECT 1 FROM {Daemon._meta.db_table} sd"  # noqa: S608 - the model's table
    " WHERE sd.state = ANY(%(serving_live)s::text[])"
    " AND CASE WHEN {name} = '' THEN sd.queues = '{{}}'"
    " ELSE sd.queues @> ARRAY[{name}]::varchar(63)[] END)"
)
_STARTS = (
    f"EXISTS (SELECT 1 FROM {Queue._meta.db_table} sq"  # noqa: S608 - the model's table
    " WHERE sq.name = {name} AND " + STARTS_DAEMONS_SQL.format(queue="sq") + ")"
)
PARAMS = {"serving_live": [str(state) for state in LIVE_DAEMON_STATES]}


def columns(name_sql: str) -> str:
    """`live` and `starts` as two output columns, for the queue whose name `name_sql`
    is (a cast parameter or a column); the statement takes PARAMS too."""
    return (
        f"{_LIVE.format(name=name_sql)} AS serving_live, "
        f"{_STARTS.format(name=name_sql)} AS serving_starts"
    )


def start_command(queue: str) -> str:
    """The command that starts a daemon serving `queue` on this machine."""
    return f"lakeshore daemon run --queues {queue}" if queue else "lakeshore daemon run"


@dataclass(frozen=True)
class Serving:
    queue: str
    live: bool  # a live daemon serves it
    starts: bool  # else its provider starts one (the controller's next decision)

    @property
    def wakes(self) -> bool:
        """A submit here wakes the controller."""
        return not self.live and self.starts

    @property
    def hint(self) -> str:
        """What a submit here tells its user ('' when something will run it)."""
        if self.live or self.starts:
            return ""
        where = f"queue {self.queue}" if self.queue else "the default queue"
        return (
            f"No live daemon serves {where} and no provider starts one: it stays queued "
            f"until one does. Start one with '{start_command(self.queue)}'."
        )


def of_queues(names: list[str]) -> dict[str, Serving]:
    """Serving of each of `names`, in one query."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    sql = f"SELECT n.name, {columns('n.name')} FROM unnest(%(names)s::text[]) AS n(name)"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, {**PARAMS, "names": wanted})
        return {name: Serving(name, live, starts) for name, live, starts in cursor.fetchall()}


def of_queue(name: str) -> Serving:
    return of_queues([name])[name]


# ---------------------------------------------------------------------------- the wake

# Sent once a submit commits into a queue that no live daemon serves and whose provider
# starts daemons (Serving.wakes), with the queue's name: the controller, in fleet/ above
# this app, listens (fleet/tasks.py) and decides for that queue at once.
wake_wanted = Signal()


def after_submit(serving: Serving) -> None:
    """Wake the controller for this queue once the submit commits, if it needs one."""
    if serving.wakes:
        transaction.on_commit(lambda: wake_wanted.send(sender=Serving, queue=serving.queue))
