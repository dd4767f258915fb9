"""Daemons parked in a long-poll: how long a claim may wait, and the renewal of their
liveness while they wait.

An idle daemon's claim waits up to CLAIM_WAIT_MAX seconds for work, and it sends no
heartbeat while it waits: its poll is its heartbeat. The web process it waits in renews
every parked daemon at once, every renew_every() seconds, in one statement (PARKED:
jobs/wakeup.py's listening thread runs it for the waits it holds, parked on an event
loop or asleep in a thread), so a fleet of idle daemons costs one write a turn, not one
a poll, and a claim's wait is not bound by the heartbeat timeout. A daemon that goes
away while it waits under the ASGI server is seen going (its connection closes:
jobs/waits.drive_async), and is renewed no more."""

from django.conf import settings
from django.db import connection

from fleet.models import LIVE_DAEMON_STATES
from jobs import wakeup


def write_every() -> float:
    """Seconds a heartbeat time is kept before it is rewritten: at most
    LAKESHORE_HEARTBEAT_WRITE_SECONDS, and a quarter of the timeout."""
    return min(
        float(settings.LAKESHORE_HEARTBEAT_WRITE_SECONDS),
        settings.LAKESHORE_HEARTBEAT_TIMEOUT / 4,
    )


CLAIM_WAIT_MAX = 50  # seconds a claim may wait for work (the claim's and exchange's `wait`)


def longest_wait() -> float:
    """Seconds a claim may wait here. A daemon parked in a long-poll sends no heartbeat:
    the server renews it while it waits (PARKED, every renew_every() seconds), so its
    wait is not bound by the heartbeat timeout."""
    return float(CLAIM_WAIT_MAX)


# A wait this long or longer ends at its daemon's phase (wait_ends): an idle daemon's
# (its default is CLAIM_WAIT_MAX). Shorter ones end when they were asked to.
PHASED_FROM = 40.0
_GOLDEN = (5**0.5 - 1) / 2  # the ids' phases spread evenly whatever their number


def wait_ends(daemon_id: int, wait: float, since: float) -> float:
    """When (time.monotonic()) the wait of a claim that arrived at `since` ends. A long
    wait ends at the last moment before since + wait at which its daemon's phase comes
    round (daemon_id × the golden ratio, a fraction of the wait): a fleet that came up
    together (and parked together) comes back at moments spread evenly over the wait,
    not in one wave. A daemon's first wait may be cut short; the ones after it, sent
    as the one before was answered, last the whole wait."""
    end = since + wait
    if wait < PHASED_FROM:
        return end
    phase = (daemon_id * _GOLDEN) % 1.0 * wait
    return end - (end - phase) % wait


def renew_every() -> float:
    """Seconds between renewals of parked daemons: a quarter of the heartbeat timeout,
    so a daemon between two polls at a renewal's moment is still renewed well in time
    at the next."""
    return settings.LAKESHORE_HEARTBEAT_TIMEOUT / 4


# Live daemons waiting in a claim, renewed in one statement (rows a transaction holds, a
# claim's or the reaper's, are skipped: that claim renews its own daemon), in id order,
# so that two renewals never wait on each other's rows.
_RENEW_SQL = """
UPDATE fleet_daemon d SET last_heartbeat_at = now()
  FROM (SELECT id FROM fleet_daemon
         WHERE id = ANY(%(ids)s) AND state = ANY(%(live)s)
           AND (last_heartbeat_at IS NULL
                OR last_heartbeat_at < now() - make_interval(secs => %(every)s))
         ORDER BY id
           FOR NO KEY UPDATE SKIP LOCKED) parked
 WHERE d.id = parked.id
"""


def renew_parked(daemon_ids: list[int]) -> None:
    """The heartbeat of daemons waiting in a claim: their poll is their heartbeat for
    as long as it waits. Called by the listening thread (jobs/wakeup.py), in a thread
    of its own; its connection goes back to the pool."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                _RENEW_SQL,
                {
                    "ids": list(daemon_ids),
                    "live": [str(s) for s in LIVE_DAEMON_STATES],
                    "every": write_every(),
                },
            )
    finally:
        connection.close()


PARKED = wakeup.Renewal(every=renew_every, renew=renew_parked)
