"""A daemon's life: registering, running (the threads start, the work is served, then
everything stops), stopping on signals (the first drains, the second stops now),
deregistering, and what it does when the server lets go of it (dropped: leave; lost:
kill its copies and register again)."""

import os
import signal
import threading

from lakeshore.client import path
from lakeshore.errors import ApiError, CliError
from lakeshore.pool.pool import Pool
from lakeshore.worker.calls import DAEMON_LOST, DAEMON_TERMINATED, TOKEN_REVOKED, Stopped
from lakeshore.worker.environment import job_environment

# The shortest interval --heartbeat allows: a server whose timeout is below three of
# these cannot be met (the server refuses such a timeout: LAKESHORE_HEARTBEAT_TIMEOUT).
HEARTBEAT_FLOOR = 0.5


class Lifecycle:
    """The Worker's lifecycle (lakeshore.worker.daemon holds the state it uses)."""

    def register(self) -> None:
        """Register with the token we started with (again after the reaper marked us
        lost), then speak with the daemon's own credential the server answers: the
        starting token may register daemons but never acts as them."""
        body = {"name": self.name, "queues": self.queues}
        daemon = self.call(
            "POST",
            path("daemons", "register"),
            body,
            give_up=self.draining,
            token=self.bootstrap_token,
        )
        if daemon.get("token"):  # None: the token we started with is this daemon's own
            self.client.use_token(daemon["token"])
        self.daemon_id = str(daemon["id"])
        where = ", ".join(self.queues) if self.queues else "the default queue"
        self.log(f"registered daemon {self.daemon_id} ({self.name}) serving {where}")
        self._renew_within(daemon.get("heartbeat_timeout"))

    def _renew_within(self, timeout) -> None:
        """Beat at least three times within the server's timeout, whatever --heartbeat
        says: a busy daemon on a loaded machine must never be taken for lost."""
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            return  # an older server: keep --heartbeat
        fastest = max(HEARTBEAT_FLOOR, timeout / 3)
        if self.heartbeat_interval > fastest:
            self.heartbeat_interval = fastest
            self.log(
                f"heartbeat every {fastest:g} s: a third of the server's {timeout:g} s "
                "timeout (--heartbeat asked for more)"
            )

    def run(self) -> int:
        # Job processes die when the thread that forked them exits (PR_SET_PDEATHSIG):
        # this thread starts them all (the claim loop, and the pool's processes) and
        # kills them all before it returns, so it outlives each of them.
        self.spawner = threading.current_thread()
        try:
            self.register()
        except Stopped:
            self.log("stopped before the server answered; nothing was registered")
            return 0
        self.pool = Pool(
            size=self.concurrency,
            isolation=self.isolation,
            environment=lambda invocation: job_environment(
                os.environ, self.job_env_extra, invocation
            ),
            done=self._done,
            lock=self.lock,
            spawner=self.spawner,
            allowed_modules=self.allowed_modules,
            allow_pickled=self.allow_pickled,
            max_tasks=self.max_tasks_per_worker,
            max_memory_mb=self.max_worker_memory,
            log=self.log,
            debug=self.debug,
            stopping=self.draining.is_set,
            output=self._output,
        )
        beat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        self.reporter.start()
        self.shipper.start()
        beat.start()
        try:
            self._serve()
            self._wait_for_running()
        finally:
            self.hard_stop.set()
            self._kill_all("daemon stopping")
            self.pool.close()
            self.shipper.close(5)  # the lines first: outcomes wait for theirs
            self.reporter.close(5)
            if not self.dropped.is_set():
                self._deregister()
        summary = ", ".join(f"{n} {state}" for state, n in self.counts.items())
        self.log(f"daemon {self.daemon_id} stopped ({summary})")
        return 0

    def request_stop(self, signum=None, frame=None) -> None:
        """First SIGTERM/SIGINT: finish current work. Second: stop it now."""
        if self.draining.is_set():
            self.log("second signal: stopping running invocations now")
            self.hard_stop.set()
            with self.lock:
                self.slot_free.notify_all()
            return
        self.log("stopping: no more claims; finishing running invocations (signal again to abort)")
        self.draining.set()
        with self.lock:
            self.slot_free.notify_all()
        if self.daemon_id is not None:  # its waiting claim answers at once
            threading.Thread(target=self.tell_draining, name="drain", daemon=True).start()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def _deregister(self) -> None:
        try:
            self.client.request("POST", path("daemons", self.daemon_id, "deregister"))
            self.log(f"deregistered daemon {self.daemon_id}")
        except ApiError as exc:
            if exc.code == TOKEN_REVOKED:  # ended on the server (scale-down) meanwhile
                self.log(f"daemon {self.daemon_id} had already been ended on the server")
            else:
                self.log(f"could not deregister ({exc.message}); the server will mark it lost")
        except CliError as exc:
            self.log(f"could not deregister ({exc.message}); the server will mark it lost")

    def _should_stop(self) -> bool:
        return self.draining.is_set() or self.dropped.is_set() or self.hard_stop.is_set()

    def _handle_not_live(self, exc: ApiError, failed_id: str | None) -> None:
        """409 on heartbeat or claim: daemon_terminated (dropped) → leave; daemon_lost →
        the reaper gave our work away: kill our copies, register again, carry on."""
        with self.register_lock:
            if failed_id != self.daemon_id:
                return  # the other thread already handled it
            self._not_live(exc)

    def _not_live(self, exc: ApiError) -> None:
        if exc.code in (DAEMON_TERMINATED, TOKEN_REVOKED):
            if exc.code == TOKEN_REVOKED:  # a daemon's credential is revoked as it ends
                self.log(
                    f"daemon {self.daemon_id} was removed on the server (its credential is "
                    "revoked): stopping"
                )
            else:
                self.log(f"daemon {self.daemon_id} was removed on the server: stopping")
            self.dropped.set()
            self._kill_all("daemon removed")
            with self.lock:
                self.slot_free.notify_all()
            return
        if exc.code == DAEMON_LOST:
            self.log(f"daemon {self.daemon_id} was marked lost ({exc.message})")
        else:  # a 409 this daemon does not know: its work is not ours any more either
            self.log(f"daemon {self.daemon_id} refused ({exc.code or 'no code'}: {exc.message})")
        self._kill_all("its invocations were handed back by the server")
        if self._should_stop():
            self.log("not registering again: stopping")
            self.dropped.set()  # nothing left to finish; the server already let go of us
            with self.lock:
                self.slot_free.notify_all()
            return
        self.log("registering again")
        self.register()
