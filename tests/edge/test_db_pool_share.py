"""Issue 29, item 3, through `make run`'s server (gunicorn, one uvicorn worker, a pool
of 4 connections): no caller holds more than its share of the database pool.

- The pool keeps LAKESHORE_DB_POOL_RESERVE (2 here) connections for the daemon
  protocol and /readyz (lakeshore_admin/dbpool.py). Operators' PATCHes, each stuck on
  a queue row this test holds, take every connection other requests may use: another
  operator read then waits and fails (503), while a daemon's heartbeat, claim and
  registration, and /readyz, answer 200. Negative control: with no reserve the same
  PATCHes take the whole pool, and the claim and /readyz fail.
- One user runs at most LAKESHORE_HEAVY_PER_PRINCIPAL (1 here) heavy requests at once
  (accounts/heavy.py): while an operator's apply waits on a held row, that operator's
  export and bulk cancel are refused at once (429 busy, Retry-After), another
  operator's export is served, and once the apply has ended the first operator's
  export is served too."""

import contextlib
import threading
import time

import httpx
import psycopg
import pytest
from django.db import connection

from tests.support import builders
from tests.support.servers import environment, gunicorn

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.security]

POOL = {
    "LAKESHORE_WEB_WORKERS": "1",
    "LAKESHORE_DB_POOL_MAX": "4",
    "LAKESHORE_DB_POOL_TIMEOUT": "1",  # a request with no connection gives up after 1 s
    "LAKESHORE_HEAVY_PER_PRINCIPAL": "1",
    "LAKESHORE_APPLY_LOCK_TIMEOUT": "60",  # an apply on a held row waits while we look
}


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_setup):
    """One server for the module, with 2 of its 4 connections kept for the daemons."""
    tmp_path = tmp_path_factory.mktemp("pool-share")
    with gunicorn(tmp_path, environment(tmp_path, **POOL, LAKESHORE_DB_POOL_RESERVE="2")) as (
        base,
        _,
    ):
        yield base


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@contextlib.contextmanager
def held_row(queue: str):
    """The queue's row locked by a connection of this test (as a long request
    elsewhere would hold it) until the block ends."""
    with psycopg.connect(**connection.get_connection_params()) as holder:
        holder.execute("SELECT 1 FROM queues_queue WHERE name = %s FOR UPDATE", [queue])
        yield
        holder.rollback()


def wait_for_lock_waiters(count: int) -> None:
    """Until `count` of the server's statements wait on a lock (each holds a connection)."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as probe:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            (waiting,) = probe.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if waiting >= count:
                return
            time.sleep(0.05)
    pytest.fail(f"{waiting} statements wait on a lock, not {count}")


class InThreads:
    """Requests sent from threads of their own; `answers` once they are joined."""

    def __init__(self):
        self.threads: list[threading.Thread] = []
        self.answers: list[int] = []

    def send(self, method: str, url: str, token: str, body: dict) -> None:
        def call():
            answer = httpx.request(method, url, json=body, headers=bearer(token), timeout=90)
            self.answers.append(answer.status_code)

        thread = threading.Thread(target=call)
        thread.start()
        self.threads.append(thread)

    def join(self) -> list[int]:
        for thread in self.threads:
            thread.join(90)
        return sorted(self.answers)


def stuck_patches(base: str, count: int) -> InThreads:
    """`count` operator PATCHes of queue w, each waiting on its held row (with a
    connection) or for a connection."""
    operator = builders.token("operator")
    patches = InThreads()
    for index in range(count):
        url = f"{base}/api/v1/queues/w/"
        patches.send("PATCH", url, operator, {"description": f"patch {index}"})
    return patches


def a_daemon(base: str) -> tuple[str, str, str]:
    """(daemon id, its own credential, the bootstrap token), registered through the API,
    on queue d: not the queue whose row the test holds, which a claim waits for (by
    design: a queue's change fences its claims), whatever the pool."""
    bootstrap = builders.token("daemon")
    answer = httpx.post(
        f"{base}/api/v1/daemons/register/",
        json={"name": f"d-{time.monotonic_ns()}", "queues": ["d"]},
        headers=bearer(bootstrap),
    )
    assert answer.status_code == 201, answer.text
    body = answer.json()
    return str(body["id"]), body.get("token") or bootstrap, bootstrap


def status(method: str, url: str, token: str | None = None, body: dict | None = None):
    """The answer's status, or "no answer" when none came in 15 s."""
    headers = bearer(token) if token else {}
    try:
        return httpx.request(method, url, json=body, headers=headers, timeout=15).status_code
    except httpx.TimeoutException:
        return "no answer"


def daemon_calls(base: str, daemon: str, token: str, bootstrap: str) -> dict:
    """What each of a daemon's calls and /readyz answered, sent one after another."""
    at = f"{base}/api/v1/daemons/{daemon}"
    another = {"name": f"d-{time.monotonic_ns()}", "queues": ["d"]}
    return {
        "heartbeat": status("POST", f"{at}/heartbeat/", token, {"held": []}),
        "claim": status("POST", f"{at}/claim/", token, {"limit": 1, "wait": 0}),
        "register": status("POST", f"{base}/api/v1/daemons/register/", bootstrap, another),
        "readyz": status("GET", f"{base}/readyz"),
    }


def test_the_daemons_keep_their_connections_while_other_requests_hold_the_rest(server):
    builders.queue("w")
    builders.queue("d")
    daemon, token, bootstrap = a_daemon(server)
    operator = builders.token("operator")

    with held_row("w"):
        patches = stuck_patches(server, 3)  # the general share is 2: the third waits
        wait_for_lock_waiters(2)
        read = httpx.get(f"{server}/api/v1/queues/", headers=bearer(operator), timeout=30)
        calls = daemon_calls(server, daemon, token, bootstrap)
    answers = patches.join()

    # the saturation is real: an operator's read found no connection in 1 s
    assert read.status_code == 503 and read.json()["error"]["code"] == "unavailable"
    assert calls == {"heartbeat": 200, "claim": 200, "register": 201, "readyz": 200}
    assert answers.count(200) >= 2  # the stuck ones went on once the row was free


def test_control_with_no_reserve_other_requests_take_the_daemons_connections(
    tmp_path, django_db_setup
):
    env = environment(tmp_path, **POOL, LAKESHORE_DB_POOL_RESERVE="0")
    with gunicorn(tmp_path, env) as (base, _):
        builders.queue("w")
        builders.queue("d")
        daemon, token, bootstrap = a_daemon(base)
        with held_row("w"):
            patches = stuck_patches(base, 4)  # the whole pool
            wait_for_lock_waiters(4)
            calls = daemon_calls(base, daemon, token, bootstrap)
        patches.join()

    # each waited for a connection the PATCHes held, and gave up (503 unavailable)
    assert set(calls.values()) <= {503, "no answer"}, calls


def test_one_users_heavy_requests_are_bounded_and_another_users_go_through(server):
    builders.queue("w", description="old")
    first, second = builders.token("operator"), builders.token("operator")
    document = {"document": {"queues": [{"name": "w", "description": "new"}]}}

    with held_row("w"):
        applying = InThreads()
        applying.send("POST", f"{server}/api/v1/apply/", first, document)
        wait_for_lock_waiters(1)  # the first user's apply runs (waits on the row)
        export = httpx.get(f"{server}/api/v1/export/", headers=bearer(first))
        cancel = httpx.post(
            f"{server}/api/v1/jobs/bulk-cancel/",
            json={"queue": "w", "dry_run": True},
            headers=bearer(first),
        )
        others = httpx.get(f"{server}/api/v1/export/", headers=bearer(second))
    assert applying.join() == [200]

    for refused in (export, cancel):
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "busy"
        assert "LAKESHORE_HEAVY_PER_PRINCIPAL" in refused.json()["error"]["message"]
        assert refused.headers["Retry-After"] == "2"
    assert others.status_code == 200
    # control: the apply ended, the same user's export is served
    assert httpx.get(f"{server}/api/v1/export/", headers=bearer(first)).status_code == 200
