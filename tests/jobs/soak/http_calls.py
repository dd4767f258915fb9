"""The REST protocol as the soak's threads speak it: the error codes that matter, the
answers that mean a report was refused, what says the server let a daemon go, and one
request that rides out 5xx answers and connection errors with back-off, as the real
daemon does."""

import httpx

from tests.jobs.soak.ledger import Shared

LOST = "daemon_lost"
TERMINATED = "daemon_terminated"
STALE = "claim_stale"
ALREADY = "already_completed"
BACKOFF_START, BACKOFF_MAX = 0.05, 1.0

# Answers that mean the server refused the report: the claim was no longer valid.
REFUSED = {STALE, f"refused whole ({LOST})", f"refused whole ({TERMINATED})"}


def error_code(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""


def let_go(response) -> str | None:
    """LOST or TERMINATED when the server let this daemon go: a 409 saying so, or a 401
    for its revoked credential (revoked as the daemon is ended, which `lakeshore daemon
    run` reads as removed); else None."""
    code = error_code(response)
    if response.status_code == 409 and code in (LOST, TERMINATED):
        return code
    if response.status_code == 401 and code == "token_revoked":
        return TERMINATED
    return None


def call(
    shared: Shared,
    http: httpx.Client,
    method: str,
    url: str,
    body=None,
    *,
    give_up=None,
    headers=None,
):
    """One request that rides out 5xx answers and connection errors with back-off.
    None when `give_up()` (or the test's stop) came first. Returns (response, retried)."""
    delay = BACKOFF_START
    retried = False
    kind = url.rstrip("/").rsplit("/", 1)[-1]
    kind = "drop" if method == "DELETE" else kind
    while True:
        shared.stats.add(f"requests: {kind}")
        try:
            response = http.request(method, url, json=body, headers=headers)
        except httpx.TransportError:
            shared.stats.add("connection errors ridden out")
        else:
            if response.status_code < 500:
                return response, retried
            key = "503s ridden out" if response.status_code == 503 else "other 5xx ridden out"
            shared.stats.add(key)
        retried = True
        if shared.stop.is_set() or (give_up is not None and give_up()):
            return None, retried
        shared.stop.wait(delay)
        delay = min(delay * 2, BACKOFF_MAX)
