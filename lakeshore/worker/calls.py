"""Speaking with the server: the daemon's requests, retried with back-off while the
server is unreachable or failing (5xx), `Stopped` when the daemon stops meanwhile, and
the error codes the daemon branches on (never on a message)."""

import threading

from lakeshore.errors import ApiError, CliError

BACKOFF_START = 0.5
BACKOFF_MAX = 10.0

# The server's 409 codes the daemon acts on (lakeshore_admin.errors.CODES).
DAEMON_TERMINATED = "daemon_terminated"  # dropped or ended on the server: stop
DAEMON_LOST = "daemon_lost"  # the reaper gave our work away: kill it, register again
TOKEN_REVOKED = "token_revoked"  # noqa: S105 - an error code (401): the server ended us: stop
CLAIM_STALE = "claim_stale"  # a complete for a claim we no longer hold: log, no retry


class Stopped(Exception):
    """The daemon is shutting down while it waited for the server."""


class Calls:
    """The Worker's requests (lakeshore.worker.daemon holds the state they use)."""

    def call(
        self,
        method: str,
        url: str,
        json_body=None,
        *,
        give_up: threading.Event | None = None,
        token: str | None = None,
    ):
        """A request that rides out an unreachable or failing server (5xx) with
        exponential back-off. 4xx answers are raised: they are the server's word."""
        return self.client.decode(self.send(method, url, json_body, give_up=give_up, token=token))

    def send(
        self,
        method: str,
        url: str,
        json_body=None,
        *,
        give_up: threading.Event | None = None,
        token: str | None = None,
        timeout: float | None = None,
    ):
        """`call`, answering the response itself (its headers). `token`: this one
        request speaks with it (registering: the token the daemon started with).
        `timeout`: seconds this one request may take (a long-poll)."""
        delay = BACKOFF_START
        while True:
            try:
                return self.client.send(method, url, json=json_body, token=token, timeout=timeout)
            except ApiError as exc:
                if exc.status < 500:
                    raise
                problem = f"server error {exc.status}: {exc.message}"
            except CliError as exc:  # unreachable, timed out, not JSON
                problem = exc.message
            if (give_up and give_up.is_set()) or self.hard_stop.is_set():
                raise Stopped(problem)
            self.log(f"{problem}; retrying in {delay:.1f} s")
            (give_up or self.hard_stop).wait(delay)
            delay = min(delay * 2, BACKOFF_MAX)
