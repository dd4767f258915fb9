"""Operators' orders to a daemon (daemon exec: TERM, INT, KILL), from a heartbeat's
answer: each stops one invocation's process group, on a thread of its own so that a
TERM's grace does not hold up the heartbeats, and tells the server what it did."""

import signal
import threading
import time
from collections.abc import Callable

from lakeshore.client import path
from lakeshore.errors import CliError
from lakeshore.pool.job_process import Running
from lakeshore.worker.calls import Session, Stopped
from lakeshore.worker.slots import Slots
from lakeshore.worker.stopping import Stopping

EXEC_GRACE = 10.0  # seconds an invocation sent TERM or INT by an operator has to exit
EXEC_SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "KILL": signal.SIGKILL}


class Orders:
    """Carries out operators' orders on the invocations the `slots` hold."""

    def __init__(
        self,
        session: Session,
        slots: Slots,
        stopping: Stopping,
        *,
        log: Callable[[str], None],
        killed: Callable[[], None],
    ):
        self.session = session
        self.slots = slots
        self.stopping = stopping
        self.log = log
        self.killed = killed  # counts an invocation stopped here (the daemon's summary)

    def obey(self, commands: list[dict]) -> None:
        """Carries out each order on a thread of its own."""
        for command in commands:
            threading.Thread(
                target=self._carry_out, args=(command,), name="exec", daemon=True
            ).start()

    def _carry_out(self, command: dict) -> None:
        """Stops the invocation's process group: KILL at once; TERM or INT, then KILL if
        it still runs after EXEC_GRACE. The server already ended the invocation (killed),
        so its outcome is not reported. Says what it did, in the log and to the server."""
        invocation, wanted = str(command.get("invocation")), str(command.get("signal"))
        item = self.slots.let_go(invocation, grace=EXEC_GRACE)
        if item is not None:
            self.killed()
        if item is None:
            result = "it no longer ran here"
        elif wanted not in EXEC_SIGNALS:
            result = f"unknown signal {wanted!r}: stopped with KILL instead"
            self.slots.kill(item)
        elif wanted == "KILL":
            result = "SIGKILL sent to its process group" if self.slots.kill(item) else "gone"
        elif not self.slots.signal(item, EXEC_SIGNALS[wanted]):
            result = "its process had already ended"
        else:
            result = self._grace(item, wanted)
        order = f"daemon exec {command.get('verb')} {wanted}".strip()
        self.log(f"invocation {invocation}: stopped by {command.get('by')} ({order}): {result}")
        try:
            url = path("daemons", self.session.daemon_id, "commands", command.get("id"), "done")
            self.session.call("POST", url, {"result": result}, give_up=self.stopping.hard)
        except (CliError, Stopped) as exc:
            self.log(f"could not tell the server command {command.get('id')} was done ({exc})")

    def _grace(self, item: Running, wanted: str) -> str:
        if self.slots.wait_for_end(item, time.monotonic() + EXEC_GRACE):
            return f"SIG{wanted} sent to its process group; it exited"
        self.slots.kill(item)
        return f"SIG{wanted} sent; still running after {EXEC_GRACE:g} s: SIGKILL"
