"""The daemon's exchange without a server (httpx.MockTransport): outcomes waiting go with
the next claim in one request; the reporter leaves them to the claim loop while it will
carry them; a server without exchange (404) gets complete and claim apart; refusals
give the outcomes back to the reporter."""

import json
import threading
import time

import httpx
import pytest

from jobs import services
from jobs.models import Invocation
from lakeshore.client import Client
from lakeshore.errors import ApiError
from lakeshore.pool.job_process import Running
from lakeshore.worker import calls
from lakeshore.worker.calls import Stopped
from lakeshore.worker.claim_loop import WIRES
from lakeshore.worker.daemon import Worker
from lakeshore.worker.reporting import Outcome, Reporter
from tests.support import builders


def _outcome(n: int, state: str = "succeeded", daemon_id: str = "7") -> Outcome:
    item = Running({"id": n, "attempts": 1, "function": "f"}, daemon_id=daemon_id)
    return Outcome(item, state, {"n": n} if state == "succeeded" else None, "", 0.01)


def _job(n: int) -> dict:
    return {"id": str(n), "attempts": 1, "function": "f", "args": [], "kwargs": {}}


def _error(status: int, code: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message}})


def _recorded(outcomes: list[dict]) -> list[dict]:
    return [{"invocation": str(o["invocation"]), "ok": True, "state": o["state"]} for o in outcomes]


class Server:
    """Answers by the request's last path segment (claim, exchange, complete) with what
    the test sets, and records every request."""

    def __init__(self, **answers):
        self.answers = answers  # segment → (body) → httpx.Response
        self.requests: list[tuple[str, object]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.url.path, body))
        segment = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        return self.answers[segment](body)

    def paths(self) -> list[str]:
        return [url.rstrip("/").rsplit("/", 1)[-1] for url, _ in self.requests]


@pytest.fixture
def daemon(monkeypatch):
    monkeypatch.setattr(calls, "BACKOFF_START", 0.01)  # read by Session.send

    def make(**answers):
        server = Server(**answers)
        client = Client("http://lakeshore.test", "t", transport=httpx.MockTransport(server.handle))
        lines: list[str] = []
        w = Worker(client, queues=["q"], log=lines.append, debug=lines.append, claim_wait=5.0)
        w.session.daemon_id = "7"
        return w, server, lines

    return make


def _exchanged(body):
    return httpx.Response(
        200, json={"recorded": _recorded(body["outcomes"]), "claimed": [_job(40)]}
    )


def test_outcomes_waiting_go_with_the_claim_in_one_request(daemon):
    w, server, lines = daemon(exchange=_exchanged)
    w.reporter.put(_outcome(1))
    w.reporter.put(_outcome(2, "failed"))

    claimed = w.claims.claim("7", limit=2, busy=True)

    assert claimed == [_job(40)]
    assert server.requests == [
        (
            "/api/v1/daemons/7/exchange/",
            {
                "outcomes": [
                    {
                        "invocation": 1,
                        "attempt": 1,
                        "state": "succeeded",
                        "result": {"n": 1},
                        "error": "",
                    },
                    {"invocation": 2, "attempt": 1, "state": "failed", "result": None, "error": ""},
                ],
                "limit": 2,
                "wait": 0,  # their answers come at once: no long-poll
                "wires": ["json", "envelope"],
            },
        )
    ]
    assert w.completer.counts == {"succeeded": 1, "failed": 1, "timeout": 0, "killed": 0}
    assert w.reporter.pending() == 0
    assert "invocation 1: succeeded in 0.01 s" in lines
    assert any(line.startswith("reported 2 outcome(s) in 1 request(s)") for line in lines)


def test_without_outcomes_it_is_a_long_poll_claim(daemon):
    w, server, lines = daemon(claim=lambda body: httpx.Response(200, json=[]))
    assert w.claims.claim("7", limit=3, busy=True) == []
    assert w.claims.claim("7", limit=3, busy=False) == []
    assert server.requests == [
        ("/api/v1/daemons/7/claim/", {"limit": 3, "wait": 2.0, "wires": WIRES}),
        ("/api/v1/daemons/7/claim/", {"limit": 3, "wait": 5.0, "wires": WIRES}),
    ]


def test_only_the_outcomes_of_the_claiming_registration_go_with_it(daemon):
    w, server, lines = daemon(exchange=_exchanged, claim=lambda body: httpx.Response(200, json=[]))
    w.reporter.put(_outcome(1, daemon_id="6"))  # claimed before registering again

    w.claims.claim("7", limit=1, busy=False)

    assert server.paths() == ["claim"]
    assert w.reporter.pending_ids() == ["1"]  # the reporter sends it to daemon 6


def test_a_server_without_exchange_gets_complete_and_claim_apart(daemon):
    w, server, lines = daemon(
        exchange=lambda body: _error(404, "not_found", "No API endpoint at …/exchange/"),
        claim=lambda body: httpx.Response(200, json=[_job(40)]),
        complete=lambda body: httpx.Response(200, json=_recorded(body)),
    )
    w.reporter.put(_outcome(1))
    w.reporter.put(_outcome(2))

    assert w.claims.claim("7", limit=2, busy=True) == [_job(40)]

    assert server.paths() == ["exchange", "claim"]
    assert server.requests[1][1] == {"limit": 2, "wait": 2.0, "wires": WIRES}
    assert w.claims.exchange is False
    assert w.reporter.pending_ids() == ["1", "2"]  # given back, in their order
    assert any("the server has no exchange" in line for line in lines)

    w.reporter.start()  # the reporter sends them as before: one complete with the list
    w.reporter.close(10)
    assert server.paths() == ["exchange", "claim", "complete"]
    assert [o["invocation"] for o in server.requests[2][1]] == [1, 2]
    assert w.completer.counts["succeeded"] == 2

    w.reporter.put(_outcome(3))  # and exchange is asked no more (the closed reporter keeps it)
    w.claims.claim("7", limit=1, busy=False)
    assert server.paths()[-1] == "claim"
    assert w.reporter.pending_ids() == ["3"]


def test_a_daemon_no_longer_live_gets_the_409_and_the_reporter_the_outcomes(daemon):
    w, server, lines = daemon(exchange=lambda body: _error(409, "daemon_lost", "marked lost"))
    w.reporter.put(_outcome(1))

    with pytest.raises(ApiError) as refused:
        w.claims.claim("7", limit=1, busy=True)

    assert (refused.value.status, refused.value.code) == (409, "daemon_lost")
    # complete, sent to the old registration, says which were recorded (a retry)
    assert w.reporter.pending_ids() == ["1"]
    assert w.completer.counts["succeeded"] == 0


def test_an_exchange_refused_as_a_whole_falls_back_for_that_request(daemon):
    w, server, lines = daemon(
        exchange=lambda body: _error(400, "invalid", "outcomes.0.result: bad"),
        claim=lambda body: httpx.Response(200, json=[]),
    )
    w.reporter.put(_outcome(1))
    assert w.claims.claim("7", limit=1, busy=True) == []
    assert server.paths() == ["exchange", "claim"]
    assert w.claims.exchange is True  # this server has exchange: only that batch goes apart
    assert w.reporter.pending_ids() == ["1"]


def test_an_exchange_is_retried_whole_after_a_server_error(daemon):
    answers = iter([_error(503, "unavailable", "database down")])

    def flaky(body):
        return next(answers, None) or _exchanged(body)

    w, server, lines = daemon(exchange=flaky)
    w.reporter.put(_outcome(1))

    assert w.claims.claim("7", limit=1, busy=True) == [_job(40)]

    assert server.paths() == ["exchange", "exchange"]
    assert server.requests[0][1] == server.requests[1][1]
    assert w.completer.counts["succeeded"] == 1
    assert any("server error 503: database down; retrying in" in line for line in lines)


def test_stopping_while_the_server_is_down_gives_the_outcomes_back(daemon):
    w, server, lines = daemon(exchange=lambda body: _error(503, "unavailable", "down"))
    w.reporter.put(_outcome(1))
    w.stopping.draining.set()  # SIGTERM: claims give up on a failing server

    with pytest.raises(Stopped):
        w.claims.claim("7", limit=1, busy=True)

    assert w.reporter.pending_ids() == ["1"]


def test_a_gone_daemons_retry_counts_what_was_recorded_and_claims_nothing(daemon):
    def gone(body):
        error = {"code": "daemon_lost", "message": "marked lost"}
        recorded = [
            {"invocation": "1", "ok": True, "state": "succeeded"},
            {"invocation": "2", "ok": False, "error": error},
        ]
        return httpx.Response(200, json={"recorded": recorded, "claimed": []})

    w, server, lines = daemon(exchange=gone)
    w.reporter.put(_outcome(1))
    w.reporter.put(_outcome(2))

    assert w.claims.claim("7", limit=2, busy=True) == []
    assert w.completer.counts["succeeded"] == 1
    assert "invocation 2: outcome succeeded not recorded (daemon_lost: marked lost)" in lines
    assert w.reporter.pending() == 0


# ---------------------------------------------------------------------------- the reporter


class Collect:
    def __init__(self):
        self.batches: list[list[int]] = []
        self.sent = threading.Event()

    def send(self, batch):
        self.batches.append([int(o.item.id) for o in batch])

    def after(self):
        self.sent.set()


def test_outcomes_the_claim_loop_will_carry_wait_for_it():
    c = Collect()
    reporter = Reporter(c.send, c.after, batch=50, linger=0.005)
    reporter.start()
    reporter.carry("7")
    reporter.put(_outcome(1))
    time.sleep(0.1)  # well past the linger
    assert c.batches == []

    taken = reporter.take("7")

    assert [o.item.id for o in taken] == ["1"]
    assert reporter.pending_ids() == ["1"]  # held (heartbeats) until answered
    reporter.finished(taken)
    assert reporter.pending() == 0
    assert c.batches == []
    reporter.close(10)


def test_when_the_claim_loop_will_not_carry_them_they_leave_after_the_linger():
    c = Collect()
    reporter = Reporter(c.send, c.after, batch=50, linger=0.005)
    reporter.start()
    reporter.carry("7")
    reporter.put(_outcome(1))
    reporter.put(_outcome(2, daemon_id="6"))  # of another registration: never carried
    time.sleep(0.1)
    assert c.batches == []  # the head is the claim loop's: it keeps its order

    reporter.carry(None)  # the claim loop long-polls, or stops

    assert c.sent.wait(10)
    reporter.close(10)
    assert c.batches == [[1], [2]]


def test_a_full_batch_leaves_even_while_carried():
    c = Collect()
    reporter = Reporter(c.send, c.after, batch=3, linger=60)
    reporter.carry("7")
    for n in range(3):
        reporter.put(_outcome(n))
    reporter.start()
    assert c.sent.wait(10)
    assert c.batches == [[0, 1, 2]]
    reporter.close(10)


def test_outcomes_given_back_leave_first():
    c = Collect()
    reporter = Reporter(c.send, c.after, batch=50, linger=60)
    for n in (1, 2, 3):
        reporter.put(_outcome(n))
    taken = reporter.take("7")
    reporter.put(_outcome(4))
    reporter.give_back(taken)
    assert reporter.pending_ids() == ["1", "2", "3", "4"]
    reporter.start()
    reporter.close(10)
    assert c.batches == [[1, 2, 3, 4]]


# ---------------------------------------------------------------------------- a real server


class Counting(httpx.BaseTransport):
    """The real server over HTTP, counting requests by their last path segment; with
    `hide_exchange`, …/exchange/ answers 404 as a server without it would."""

    def __init__(self, hide_exchange: bool = False):
        self.inner = httpx.HTTPTransport()
        self.hide_exchange = hide_exchange
        self.counts: dict[str, int] = {}
        self.order: list[str] = []  # the segments, in the order sent
        self.lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        segment = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        with self.lock:
            self.counts[segment] = self.counts.get(segment, 0) + 1
            self.order.append(segment)
        if self.hide_exchange and segment == "exchange":
            return _error(404, "not_found", f"No API endpoint at {request.url.path}")
        return self.inner.handle_request(request)


def _serve(live_server, transport: Counting, jobs: int, concurrency: int):
    """A daemon (in this process, on a thread of its own) runs `jobs` echo invocations
    queued before it starts; answers its log lines once it stopped."""
    builders.queue(name="x")
    ids = [
        services.invocation_submit(function="lakeshore.functions.echo", queue="x", args=[n])[0].pk
        for n in range(jobs)
    ]
    client = Client(live_server.url, builders.token("daemon"), transport=transport)
    lines: list[str] = []
    w = Worker(
        client,
        queues=["x"],
        concurrency=concurrency,
        heartbeat_interval=1.0,
        claim_wait=1.0,
        log=lines.append,
        debug=lines.append,
    )
    thread = threading.Thread(target=w.run, name="daemon")
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if Invocation.objects.filter(pk__in=ids, state="succeeded").count() == jobs:
                break
            time.sleep(0.05)
    finally:
        w.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    states = set(Invocation.objects.filter(pk__in=ids).values_list("state", flat=True))
    assert states == {"succeeded"}, lines
    assert f"stopped ({jobs} succeeded, 0 failed, 0 timeout, 0 killed)" in lines[-1], lines
    return lines


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_against_a_real_server_a_job_costs_one_request(live_server, concurrency):
    transport = Counting()
    jobs = 30
    lines = _serve(live_server, transport, jobs, concurrency)
    counts = transport.counts
    # one exchange per job at most (each reports what ended and claims), a few claims
    # (the first; and the long-polls once the queue is empty), complete only for what
    # ended while the claim loop long-polled at the end (what it had claimed ahead)
    assert counts.get("exchange", 0) <= jobs, counts
    order = [segment for segment in transport.order if segment in ("exchange", "complete")]
    last_exchange = max(i for i, segment in enumerate(order) if segment == "exchange")
    assert "complete" not in order[:last_exchange], order
    claims = counts.get("claim", 0)
    assert counts.get("exchange", 0) + counts.get("complete", 0) + claims < 1.3 * jobs, counts
    assert not any("not recorded" in line for line in lines)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_against_a_server_without_exchange_it_reports_and_claims_apart(live_server):
    transport = Counting(hide_exchange=True)
    jobs = 10
    lines = _serve(live_server, transport, jobs, concurrency=2)
    assert transport.counts.get("exchange", 0) == 1, transport.counts  # asked once
    assert transport.counts.get("complete", 0) >= 1, transport.counts
    assert any("the server has no exchange" in line for line in lines)
