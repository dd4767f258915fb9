"""The heartbeat: a thread of its own that beats every `interval` with the ids the daemon
holds, stops local work the server no longer counts as ours, drains when the server
asks, and hands operators' orders (daemon exec) to `Orders`. It skips a beat while the
claim loop's claims keep the daemon alive (`claims_renew`)."""

import threading
import time
from collections.abc import Callable

from lakeshore.client import path
from lakeshore.errors import ApiError, CliError
from lakeshore.worker.calls import TOKEN_REVOKED, Session, Stopped
from lakeshore.worker.claim_loop import ClaimLoop, NotLive
from lakeshore.worker.orders import Orders
from lakeshore.worker.slots import Slots
from lakeshore.worker.stopping import Stopping

HELD_MAX = 10_000  # ids a heartbeat carries at most (the server's limit)

# The shortest interval --heartbeat allows: a server whose timeout is below three of
# these cannot be met (the server refuses such a timeout: LAKESHORE_HEARTBEAT_TIMEOUT).
HEARTBEAT_FLOOR = 0.5


def claims_renew(
    *, idle: bool, answered: float, now: float, interval: float, in_flight: bool = False
) -> bool:
    """The rule (Heartbeat.claims_renew; bench/fleet_swarm.py imports it): an idle
    daemon whose claim is waiting on the server, or was answered within the heartbeat
    interval, skips its heartbeat. The server renewed it when that claim arrived (a
    claim that finds the heartbeat due rewrites it), and a claim waits at most a third of
    the server's timeout (fleet/daemons.longest_wait)."""
    return idle and (in_flight or now - answered < interval)


def interval_within(interval: float, timeout: object) -> float:
    """The heartbeat interval that beats at least three times within the server's
    `timeout` (the register answer's heartbeat_timeout), whatever --heartbeat asked for:
    a busy daemon on a loaded machine must never be taken for lost. An older server
    sends no timeout: `interval` stays (bench/fleet_swarm.py imports this rule)."""
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        return interval
    return min(interval, max(HEARTBEAT_FLOOR, timeout / 3))


class Heartbeat:
    """Beats for the daemon (`start`: a thread of its own, until `stopping.hard`)."""

    def __init__(
        self,
        session: Session,
        slots: Slots,
        claims: ClaimLoop,
        orders: Orders,
        stopping: Stopping,
        *,
        interval: float,
        not_live: NotLive,
        drain_asked: Callable[[], None],
        log: Callable[[str], None],
        debug: Callable[[str], None],
    ):
        self.session = session
        self.slots = slots
        self.claims = claims
        self.orders = orders
        self.stopping = stopping
        self.interval = interval  # seconds between beats (shortened by renew_within)
        self.not_live = not_live
        self.drain_asked = drain_asked
        self.log = log
        self.debug = debug
        self.send_held = True  # beats carry the ids we hold (False: the server refused)
        self.thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def renew_within(self, timeout: object) -> None:
        """Beat at least three times within the server's timeout (interval_within)."""
        fastest = interval_within(self.interval, timeout)
        if fastest < self.interval:
            self.interval = fastest
            self.log(
                f"heartbeat every {fastest:g} s: a third of the server's {timeout:g} s "
                "timeout (--heartbeat asked for more)"
            )

    def held(self) -> list[int] | None:
        """Every invocation this daemon holds: running, or ended and not yet reported
        (the server requeues running work of ours missing from it, after a grace: a
        claim whose answer never arrived). None if too many to send."""
        ids = self.slots.held_ids()
        return sorted(ids) if len(ids) <= HELD_MAX else None

    def tell_draining(self) -> None:
        """On the first stop signal, from a thread of its own: tell the server, which
        sets this daemon draining and so answers its waiting claim at once (a server
        that does not know `drain` refuses it: the claim then ends with its wait)."""
        url = path("daemons", self.session.daemon_id, "heartbeat")
        try:
            answer = self.session.call("POST", url, {"drain": True}, give_up=self.stopping.hard)
            self._reconcile(answer)
        except (ApiError, CliError, Stopped) as exc:
            self.debug(f"could not tell the server we are draining: {exc}")

    def beat(self) -> dict:
        """One heartbeat; answers the server's answer."""
        url = path("daemons", self.session.daemon_id, "heartbeat")
        held = self.held() if self.send_held else None
        if held is None:
            return self.session.call("POST", url, give_up=self.stopping.hard)
        try:
            return self.session.call("POST", url, {"held": held}, give_up=self.stopping.hard)
        except ApiError as exc:
            if exc.status != 400:
                raise
            why = exc.message
        self.send_held = False  # a server that does not know `held`: beat without it
        self.log(f"the server refused held ids in heartbeats ({why}); sending none")
        return self.session.call("POST", url, give_up=self.stopping.hard)

    def claims_renew(self) -> bool:
        """Whether the claim loop keeps this daemon alive without a heartbeat: it runs
        nothing, has nothing to report, and a claim was answered within the interval.
        An idle daemon's long-poll renews its liveness on the server (each claim that
        finds its heartbeat due rewrites it), and its answer says when to drain; a
        heartbeat would add nothing but a request."""
        return claims_renew(
            idle=self.slots.idle(),
            answered=self.claims.answered_at(),
            now=time.monotonic(),
            interval=self.interval,
            in_flight=self.claims.waiting(),
        )

    def _loop(self) -> None:
        while not self.stopping.hard.wait(self.interval):
            if self.claims_renew():
                continue
            failed_id = self.session.daemon_id
            try:
                answer = self.beat()
            except Stopped:
                return
            except ApiError as exc:
                if exc.status == 409 or exc.code == TOKEN_REVOKED:
                    try:
                        self.not_live(exc, failed_id)
                    except Stopped:
                        return  # stopping while registering again
                    continue
                self.log(f"heartbeat refused: {exc.message}")
                continue
            self._reconcile(answer)

    def _reconcile(self, answer: dict) -> None:
        """Stop local work the server no longer counts as ours (timed out, killed)."""
        self.orders.obey(answer.get("commands") or [])
        theirs = set(answer.get("running", []))
        for item in self.slots.not_in(theirs):
            if time.monotonic() - item.started < 1.0:
                continue  # claimed after the server answered
            if item.signalled_until > time.monotonic():
                continue  # an operator's TERM or INT: its grace is not over
            item.abandoned = True
            if self.slots.kill(item):
                self.log(f"invocation {item.id}: the server ended it; stopping its process")
        if answer.get("state") == "draining":
            self.drain_asked()
