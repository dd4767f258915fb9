"""Speaking with the server: the `Session` holds who the daemon is on the server (its
registration's id and credential) and sends its requests, retried with back-off while
the server is unreachable or failing (5xx), raising `Stopped` when the daemon stops
meanwhile. And the error codes the daemon branches on (never on a message)."""

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from lakeshore.client import Client, path
from lakeshore.errors import ApiError, CliError
from lakeshore.worker.stopping import Stopping

BACKOFF_START = 0.5
BACKOFF_MAX = 10.0

# The server's 409 codes the daemon acts on (lakeshore_admin.errors.CODES).
DAEMON_TERMINATED = "daemon_terminated"  # dropped or ended on the server: stop
DAEMON_LOST = "daemon_lost"  # the reaper gave our work away: kill it, register again
TOKEN_REVOKED = "token_revoked"  # noqa: S105 - an error code (401): the server ended us: stop
CLAIM_STALE = "claim_stale"  # a complete for a claim we no longer hold: log, no retry
KILLED = "killed"  # a claim_stale's `state` when an operator killed the job before our report


class Stopped(Exception):
    """The daemon is shutting down while it waited for the server."""


class Session:
    """The daemon's side of the wire. `daemon_id` is the registration the daemon speaks
    for: written by `register` (on the thread registering, which the Worker serialises),
    read by every thread that builds a URL. Requests give up when `stopping.hard` is set,
    or the `give_up` event they pass."""

    def __init__(self, client: Client, *, stopping: Stopping, log: Callable[[str], None]):
        self.client = client
        self.bootstrap_token = client.token  # registers; the daemon's credential acts
        self.stopping = stopping
        self.log = log
        self.daemon_id: str | None = None
        # When the server stopped answering (any of the daemon's threads saw it), until
        # one of them gets an answer again and says so once.
        self.unanswered_since: float | None = None
        self.unanswered_lock = threading.Lock()

    def register(self, name: str, queues: list[str], *, give_up: threading.Event) -> dict:
        """Registers with the token the daemon started with (again after the reaper
        marked it lost), then speaks with the daemon's own credential the server
        answers: the starting token may register daemons but never acts as them.
        Answers the server's answer (its `heartbeat_timeout`)."""
        body = {"name": name, "queues": queues}
        daemon = self.call(
            "POST", path("daemons", "register"), body, give_up=give_up, token=self.bootstrap_token
        )
        if daemon.get("token"):  # None: the token we started with is this daemon's own
            self.client.use_token(daemon["token"])
        self.daemon_id = str(daemon["id"])
        return daemon

    def deregister(self) -> None:
        """Tells the server the daemon leaves (once, no retry: a server that does not
        hear it marks the daemon lost)."""
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

    def answered(self) -> None:
        """The server answered: if it had stopped answering, say once that it is back."""
        with self.unanswered_lock:
            since, self.unanswered_since = self.unanswered_since, None
        if since is not None:
            self.log(f"reconnected to the server after {time.monotonic() - since:.1f} s")

    def call(
        self,
        method: str,
        url: str,
        json_body: object = None,
        *,
        give_up: threading.Event | None = None,
        token: str | None = None,
    ) -> Any:  # the server's JSON
        """A request that rides out an unreachable or failing server (5xx) with
        exponential back-off. 4xx answers are raised: they are the server's word."""
        return self.decode(self.send(method, url, json_body, give_up=give_up, token=token))

    def decode(self, response: httpx.Response) -> Any:
        """The JSON of an answer `send` returned."""
        return self.client.decode(response)

    def send(
        self,
        method: str,
        url: str,
        json_body: object = None,
        *,
        give_up: threading.Event | None = None,
        token: str | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """`call`, answering the response itself (its headers). `token`: this one
        request speaks with it (registering: the token the daemon started with).
        `timeout`: seconds this one request may take (a long-poll)."""
        delay = BACKOFF_START
        while True:
            try:
                response = self.client.send(
                    method, url, json=json_body, token=token, timeout=timeout
                )
            except ApiError as exc:
                if exc.status < 500:
                    self.answered()
                    raise
                problem = f"server error {exc.status}: {exc.message}"
            except CliError as exc:  # unreachable, timed out, not JSON
                problem = exc.message
            else:
                self.answered()
                return response
            if (give_up and give_up.is_set()) or self.stopping.hard.is_set():
                raise Stopped(problem)
            with self.unanswered_lock:
                if self.unanswered_since is None:
                    self.unanswered_since = time.monotonic()
            self.log(f"{problem}; retrying in {delay:.1f} s")
            (give_up or self.stopping.hard).wait(delay)
            delay = min(delay * 2, BACKOFF_MAX)
