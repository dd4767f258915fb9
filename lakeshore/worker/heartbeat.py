"""The heartbeat: a thread of its own that beats every `heartbeat_interval` with the ids
the daemon holds, stops local work the server no longer counts as ours, drains when the
server asks, and carries out operators' commands (daemon exec: TERM, INT, KILL)."""

import signal
import threading
import time

from lakeshore.client import path
from lakeshore.errors import ApiError, CliError
from lakeshore.pool.job_process import Running
from lakeshore.worker.calls import TOKEN_REVOKED, Stopped

STATE_HEADER = "Lakeshore-Daemon-State"  # on a claim's answer: "draining" when asked to
HELD_MAX = 10_000  # ids a heartbeat carries at most (the server's limit)
EXEC_GRACE = 10.0  # seconds an invocation sent TERM or INT by an operator has to exit
EXEC_SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "KILL": signal.SIGKILL}


def claims_renew(
    *, idle: bool, answered: float, now: float, interval: float, in_flight: bool = False
) -> bool:
    """The rule (Heartbeats.claims_renew; bench/fleet_swarm.py imports it): an idle
    daemon whose claim is waiting on the server, or was answered within the heartbeat
    interval, skips its heartbeat. The server renewed it when that claim arrived (a
    claim that finds the heartbeat due rewrites it), and a claim waits at most a third of
    the server's timeout (fleet/daemons.longest_wait)."""
    return idle and (in_flight or now - answered < interval)


class Heartbeats:
    """The Worker's heartbeats and operators' commands (lakeshore.worker.daemon holds the
    state they use)."""

    def _held(self) -> list[int] | None:
        """Every invocation this daemon holds: running, or ended and not yet reported
        (the server requeues running work of ours missing from it, after a grace: a
        claim whose answer never arrived). None if too many to send."""
        with self.lock:
            ids = {int(key) for key in self.running}
            ids.update(int(key) for key in self.reporter.pending_ids())
        return sorted(ids) if len(ids) <= HELD_MAX else None

    def tell_draining(self) -> None:
        """On the first stop signal, from a thread of its own: tell the server, which
        sets this daemon draining and so answers its waiting claim at once (a server
        that does not know `drain` refuses it: the claim then ends with its wait)."""
        url = path("daemons", self.daemon_id, "heartbeat")
        try:
            self._reconcile(self.call("POST", url, {"drain": True}, give_up=self.hard_stop))
        except (ApiError, CliError, Stopped) as exc:
            self.debug(f"could not tell the server we are draining: {exc}")

    def _heartbeat(self) -> dict:
        url = path("daemons", self.daemon_id, "heartbeat")
        held = self._held() if self.send_held else None
        if held is None:
            return self.call("POST", url, give_up=self.hard_stop)
        try:
            return self.call("POST", url, {"held": held}, give_up=self.hard_stop)
        except ApiError as exc:
            if exc.status != 400:
                raise
            why = exc.message
        self.send_held = False  # a server that does not know `held`: beat without it
        self.log(f"the server refused held ids in heartbeats ({why}); sending none")
        return self.call("POST", url, give_up=self.hard_stop)

    def claims_renew(self) -> bool:
        """Whether the claim loop keeps this daemon alive without a heartbeat: it runs
        nothing, has nothing to report, and a claim was answered within the interval.
        An idle daemon's long-poll renews its liveness on the server (each claim that
        finds its heartbeat due rewrites it), and its answer says when to drain; a
        heartbeat would add nothing but a request."""
        with self.lock:
            idle = not self.running and not self.reporter.pending_ids()
        return claims_renew(
            idle=idle,
            answered=self.claim_answered,
            now=time.monotonic(),
            interval=self.heartbeat_interval,
            in_flight=self.claim_in_flight,
        )

    def _heartbeat_loop(self) -> None:
        while not self.hard_stop.wait(self.heartbeat_interval):
            if self.claims_renew():
                continue
            failed_id = self.daemon_id
            try:
                answer = self._heartbeat()
            except Stopped:
                return
            except ApiError as exc:
                if exc.status == 409 or exc.code == TOKEN_REVOKED:
                    try:
                        self._handle_not_live(exc, failed_id)
                    except Stopped:
                        return  # stopping while registering again
                    continue
                self.log(f"heartbeat refused: {exc.message}")
                continue
            self._reconcile(answer)

    def _obey(self, commands: list[dict]) -> None:
        """Operators' orders from a heartbeat's answer (daemon exec), each on a thread of
        its own: a TERM waits out its grace without holding up the heartbeats."""
        for command in commands:
            threading.Thread(
                target=self._carry_out, args=(command,), name="exec", daemon=True
            ).start()

    def _carry_out(self, command: dict) -> None:
        """Stops the invocation's process group: KILL at once; TERM or INT, then KILL if
        it still runs after EXEC_GRACE. The server already ended the invocation (killed),
        so its outcome is not reported. Says what it did, in the log and to the server."""
        invocation, wanted = str(command.get("invocation")), str(command.get("signal"))
        with self.lock:
            item = self.running.get(invocation)
            if item is not None:
                item.abandoned = True
                item.signalled_until = time.monotonic() + EXEC_GRACE
        if item is None:
            result = "it no longer ran here"
        elif wanted not in EXEC_SIGNALS:
            result = f"unknown signal {wanted!r}: stopped with KILL instead"
            self.pool.kill(item)
        elif wanted == "KILL":
            result = "SIGKILL sent to its process group" if self.pool.kill(item) else "gone"
        elif not self.pool.signal(item, EXEC_SIGNALS[wanted]):
            result = "its process had already ended"
        else:
            result = self._grace(item, wanted)
        order = f"daemon exec {command.get('verb')} {wanted}".strip()
        self.log(f"invocation {invocation}: stopped by {command.get('by')} ({order}): {result}")
        try:
            url = path("daemons", self.daemon_id, "commands", command.get("id"), "done")
            self.call("POST", url, {"result": result}, give_up=self.hard_stop)
        except (CliError, Stopped) as exc:
            self.log(f"could not tell the server command {command.get('id')} was done ({exc})")

    def _grace(self, item: Running, wanted: str) -> str:
        deadline = time.monotonic() + EXEC_GRACE
        with self.lock:
            while self.running.get(item.id) is item and time.monotonic() < deadline:
                self.slot_free.wait(0.1)
            ended = self.running.get(item.id) is not item
        if ended:
            return f"SIG{wanted} sent to its process group; it exited"
        self.pool.kill(item)
        return f"SIG{wanted} sent; still running after {EXEC_GRACE:g} s: SIGKILL"

    def _reconcile(self, answer: dict) -> None:
        """Stop local work the server no longer counts as ours (timed out, killed)."""
        self._obey(answer.get("commands") or [])
        theirs = set(answer.get("running", []))
        with self.lock:
            stale = [item for key, item in self.running.items() if key not in theirs]
        for item in stale:
            if time.monotonic() - item.started < 1.0:
                continue  # claimed after the server answered
            if item.signalled_until > time.monotonic():
                continue  # an operator's TERM or INT: its grace is not over
            item.abandoned = True
            if self.pool.kill(item):
                self.log(f"invocation {item.id}: the server ended it; stopping its process")
        if answer.get("state") == "draining":
            self.drain_asked()

    def drain_asked(self) -> None:
        """The server asked this daemon to drain (a heartbeat's answer, or a claim's)."""
        if not self.draining.is_set():
            self.log("the server asked this daemon to drain: finishing, then leaving")
            self.draining.set()
            with self.lock:
                self.slot_free.notify_all()
