"""Issue 17, "Admit long-polls": waiting requests cannot take every server thread.

A live server admits LAKESHORE_MAX_WAITS waits per process (jobs/waits.py). Past it, a
daemon's claim (and exchange) answers at once with what it found and `Retry-After`, on
the lean path and the full one; heartbeats still answer; the SDK's poll answers no
command (an error would end the SDK's worker), its await the current state, and a
stream that would have to wait is refused whole (503 busy). A real `lakeshore daemon
run` backs off on Retry-After instead of claiming in a tight loop.

Negative controls: with the limit out of reach the same waits sleep (and a daemon that
never sees Retry-After claims in a tight loop against a full server)."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import msgpack
import pytest

from jobs import services, waits
from jobs.models import ResultFrame
from jobs.wakeup import listener
from tests.support import builders
from tests.support.sdk_wire import answer_of
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.security]

ROOT = Path(__file__).resolve().parents[2]
LAKESHORE = str(Path(sys.executable).parent / "lakeshore")
WAIT = 20.0  # what the holders ask to wait: they outlive every check below
MSGPACK = "application/x-msgpack"


def register(base: str, bootstrap: str, name: str, queue: str = "w") -> tuple[str, str]:
    """(daemon id, the token that acts for it): its own credential when the server
    gives one, else the token that registered it."""
    answer = httpx.post(
        f"{base}/api/v1/daemons/register/",
        json={"name": name, "queues": [queue]},
        headers={"Authorization": f"Bearer {bootstrap}"},
    )
    assert answer.status_code == 201, answer.text
    body = answer.json()
    return str(body["id"]), body.get("token") or bootstrap


def claim(base, daemon, token, *, wait=WAIT, verb="claim") -> httpx.Response:
    body = {"limit": 1, "wait": wait}
    if verb == "exchange":
        body["outcomes"] = []
    return httpx.post(
        f"{base}/api/v1/daemons/{daemon}/{verb}/",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


def sdk_post(base, token, path, body) -> httpx.Response:
    return httpx.post(
        f"{base}{path}",
        content=msgpack.packb(body, use_bin_type=True),
        headers={"Authorization": f"Bearer {token}", "Content-Type": MSGPACK},
        timeout=60,
    )


class Waiting:
    """Claims long-polling in threads of their own: `start` returns once the server
    holds its wait (its slot is taken)."""

    def __init__(self, base: str):
        self.base = base
        self.bootstrap = builders.token("daemon")
        self.threads: list[threading.Thread] = []
        self.answers: list[httpx.Response] = []

    def start(self, name: str) -> threading.Thread:
        daemon, token = register(self.base, self.bootstrap, name)
        before = waits.slots.held
        thread = threading.Thread(
            target=lambda: self.answers.append(claim(self.base, daemon, token)), daemon=True
        )
        thread.start()
        wait_for(lambda: waits.slots.held == before + 1, what=f"{name} waiting", timeout=10)
        self.threads.append(thread)
        return thread

    def holding(self) -> bool:
        return all(thread.is_alive() for thread in self.threads)

    def end(self) -> None:
        listener.release_waiters()
        for thread in self.threads:
            thread.join(30)


@pytest.fixture
def waiting(live_server, settings):
    settings.LAKESHORE_MAX_WAITS = 2
    builders.queue(name="w")
    holders = Waiting(live_server.url)
    yield holders
    holders.end()


@pytest.fixture
def full(waiting):
    """A live server whose two wait slots are taken by two long-polling daemons."""
    waiting.start("holder-1")
    waiting.start("holder-2")
    return waiting


@pytest.mark.parametrize("door", ["lean", "full"])
@pytest.mark.parametrize("verb", ["claim", "exchange"])
def test_past_the_limit_a_claim_answers_at_once_empty_with_retry_after(
    full, live_server, settings, door, verb
):
    settings.LAKESHORE_LEAN_PATH = door == "lean"
    daemon, token = register(live_server.url, full.bootstrap, "third")

    answer = claim(live_server.url, daemon, token, verb=verb)

    assert answer.status_code == 200, answer.text
    assert answer.json() == ([] if verb == "claim" else {"recorded": [], "claimed": []})
    assert answer.headers["Retry-After"] == str(int(WAIT))
    assert full.holding(), "the third answered before the two waits ended"
    # heartbeats never wait, so they need no slot
    beat = httpx.post(
        f"{live_server.url}/api/v1/daemons/{daemon}/heartbeat/",
        json={},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert beat.status_code == 200, beat.text
    assert httpx.get(f"{live_server.url}/healthz").status_code == 200
    assert full.holding()


def test_control_without_the_limit_the_third_claim_waits(waiting, live_server, settings):
    settings.LAKESHORE_MAX_WAITS = 1000
    waiting.start("holder-1")
    waiting.start("holder-2")

    waiting.start("third")  # returns once the server holds its wait too

    assert waits.slots.held == 3
    waiting.end()
    assert [a.status_code for a in waiting.answers] == [200, 200, 200]
    assert all("Retry-After" not in a.headers for a in waiting.answers)


def test_a_refused_wait_still_takes_the_work_that_is_there(live_server, settings):
    settings.LAKESHORE_MAX_WAITS = 0
    builders.queue(name="w")
    queued, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="w")
    daemon, token = register(live_server.url, builders.token("daemon"), "taker")

    answer = claim(live_server.url, daemon, token)

    assert answer.status_code == 200
    assert [row["id"] for row in answer.json()] == [str(queued.pk)]
    assert "Retry-After" not in answer.headers


def test_past_the_limit_the_sdk_poll_answers_no_command(full, live_server):
    token = builders.token("daemon")

    answer = sdk_post(
        live_server.url,
        token,
        "/v1/daemon/poll",
        {"worker_id": "w1", "queue": "w", "timeout_s": 20},
    )

    assert answer.status_code == 200, answer.content
    assert msgpack.unpackb(answer.content) == {"commands": []}
    assert full.holding()
    # the SDK's own client: no command, and no error (an error would end its worker)
    dls = pytest.importorskip("dreamlake.lakeshore")
    dispatch = dls.HttpDispatch(live_server.url, token=token, timeout=30)
    try:
        assert dispatch.claim("w", "w2") is None
    finally:
        dispatch.close()
    assert full.holding()


def test_control_without_the_limit_the_sdk_poll_waits(full, live_server, settings):
    settings.LAKESHORE_MAX_WAITS = 1000
    token = builders.token("daemon")
    body = {"worker_id": "w1", "queue": "w", "timeout_s": 20}
    thread = threading.Thread(
        target=sdk_post, args=(live_server.url, token, "/v1/daemon/poll", body), daemon=True
    )
    thread.start()
    wait_for(lambda: waits.slots.held == 3, what="the poll waiting", timeout=10)
    full.threads.append(thread)  # ended with the others


def test_past_the_limit_an_sdk_await_answers_the_current_state(full, live_server, settings):
    builders.queue(name="nobody-serves")  # not the holders' queue: they would take it
    pending, _ = services.invocation_submit(
        function="lakeshore.functions.echo", queue="nobody-serves"
    )
    operator = builders.token("operator")
    path = "/v1/namespaces/default/producer/await"

    answer = sdk_post(live_server.url, operator, path, {"invocation_id": str(pending.pk)})

    assert answer.status_code == 200, answer.content
    assert msgpack.unpackb(answer.content)["state"] == "pending"
    assert full.holding()

    # negative control: with room, the same await waits (it holds a slot)
    settings.LAKESHORE_MAX_WAITS = 1000
    body = {"invocation_id": str(pending.pk), "timeout_s": 20}
    thread = threading.Thread(
        target=sdk_post, args=(live_server.url, operator, path, body), daemon=True
    )
    thread.start()
    wait_for(lambda: waits.slots.held == 3, what="the await waiting", timeout=10)
    services.invocation_kill(invocation_id=pending.pk)  # ends it: the await answers
    thread.join(30)
    assert not thread.is_alive()


def test_past_the_limit_a_stream_that_would_wait_is_refused_whole(full, live_server, settings):
    builders.queue(name="nobody-serves")  # not the holders' queue: they would take it
    pending, _ = services.invocation_submit(
        function="lakeshore.functions.echo", queue="nobody-serves"
    )
    operator = builders.token("operator")
    streams = f"{live_server.url}/v1/namespaces/default/producer/invocations"
    url = f"{streams}/{pending.pk}/result/stream"
    headers = {"Authorization": f"Bearer {operator}"}

    refused = httpx.get(url, headers=headers, timeout=30)

    assert refused.status_code == 503
    assert answer_of(refused)["error"]["code"] == "busy"
    assert int(refused.headers["Retry-After"]) >= 1
    assert full.holding()
    # a stream that is over never waits: it is served whole, slot or not
    ResultFrame.objects.create(stream="topic-a", seq=0, data=b"\x01", final=False)
    ResultFrame.objects.create(stream="topic-a", seq=1, data=b"\x02", final=True)
    over = httpx.get(f"{streams}/topic-a/result/stream", headers=headers, timeout=30)
    assert over.status_code == 200
    assert over.content == b"\x01\x02"

    # negative control: with room, the stream is taken and waits for frames (the server
    # sends its headers with the first frame, or when it ends)
    settings.LAKESHORE_MAX_WAITS = 1000
    answers = []
    thread = threading.Thread(
        target=lambda: answers.append(httpx.get(url, headers=headers, timeout=30)), daemon=True
    )
    thread.start()
    wait_for(lambda: waits.slots.held == 3, what="the stream waiting", timeout=10)
    services.invocation_kill(invocation_id=pending.pk)  # over: the stream ends
    thread.join(30)
    assert [(a.status_code, a.content) for a in answers] == [(200, b"")]
    wait_for(lambda: waits.slots.held == 2, what="the stream's slot given back", timeout=10)


# ---------------------------------------------------------------------------- the daemon


class Claims:
    """Counts the daemon's claim requests (a WSGI wrapper around the live server);
    `strip` hides the Retry-After header from it (the negative control)."""

    def __init__(self, app, strip: bool):
        self.app, self.strip, self.times = app, strip, []

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO", "").endswith(("/claim/", "/exchange/")):
            self.times.append(time.monotonic())

        def start(status, headers, exc_info=None):
            if self.strip:
                headers = [(k, v) for k, v in headers if k.lower() != "retry-after"]
            return start_response(status, headers, exc_info)

        return self.app(environ, start)


def _daemon_claims(live_server, tmp_path, *, strip: bool, window: float) -> list[float]:
    """Runs `lakeshore daemon run` against a live server that admits no wait; the
    times of its claims during `window` seconds after its first."""
    builders.queue(name="w")
    httpd = live_server.thread.httpd
    inner = httpd.get_app()
    counting = Claims(inner, strip)
    httpd.set_app(counting)
    env = {
        **os.environ,
        "LAKESHORE_URL": live_server.url,
        "LAKESHORE_TOKEN": builders.token("daemon"),
        "XDG_CONFIG_HOME": str(tmp_path),
    }
    log = open(tmp_path / "daemon.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [LAKESHORE, "daemon", "run", "--queues", "w", "-v"],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(lambda: counting.times, what="the daemon's first claim", timeout=30)
        time.sleep(window)
        first = counting.times[0]
        return [t - first for t in counting.times if t - first <= window]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log.close()
        httpd.set_app(inner)


def test_the_daemon_backs_off_with_jitter_on_retry_after(live_server, settings, tmp_path):
    settings.LAKESHORE_MAX_WAITS = 0  # every long-poll is refused: Retry-After 5 (its wait)

    claims = _daemon_claims(live_server, tmp_path, strip=False, window=12)

    # one at once, then one each 5 to 10 s: at most 3 in 12 s
    assert 1 <= len(claims) <= 3, claims
    gaps = [b - a for a, b in zip(claims, claims[1:], strict=False)]
    assert all(gap >= 5 for gap in gaps), gaps
    assert "claiming in" in (tmp_path / "daemon.log").read_text()  # said at -v


def test_control_a_daemon_that_never_sees_retry_after_claims_in_a_tight_loop(
    live_server, settings, tmp_path
):
    settings.LAKESHORE_MAX_WAITS = 0

    claims = _daemon_claims(live_server, tmp_path, strip=True, window=4)

    # a daemon that backs off makes at most one claim in 4 s (the test above); this one
    # claims again as each answer comes (tens a second), well past 10 even on a loaded
    # machine
    assert len(claims) > 10, claims
