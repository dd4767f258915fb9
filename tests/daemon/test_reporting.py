"""The daemon's outcome reports and heartbeats without a server: the reporter's batches,
the complete requests they become, and the ids a heartbeat says the daemon holds
(answered by httpx.MockTransport)."""

import json
import threading

import httpx
import pytest

from lakeshore.client import Client
from lakeshore.pool.job_process import Running
from lakeshore.worker import calls
from lakeshore.worker.daemon import Worker
from lakeshore.worker.reporting import Outcome, Reporter


def _outcome(n: int, state: str = "succeeded", daemon_id: str = "7") -> Outcome:
    item = Running({"id": n, "attempts": 1, "function": "f"}, daemon_id=daemon_id)
    return Outcome(item, state, {"n": n} if state == "succeeded" else None, "", 0.01)


class Collect:
    def __init__(self):
        self.batches: list[list[int]] = []
        self.sent = threading.Event()

    def send(self, batch):
        self.batches.append([int(o.item.id) for o in batch])

    def after(self):
        self.sent.set()


def test_a_batch_leaves_full_at_the_batch_size():
    c = Collect()
    reporter = Reporter(c.send, c.after, batch=50, linger=60)  # never by time here
    for n in range(120):
        reporter.put(_outcome(n))
    reporter.start()
    reporter.close(10)  # closing sends what is left at once
    assert [len(b) for b in c.batches] == [50, 50, 20]
    assert sum(c.batches, []) == list(range(120))  # each once, in order


def test_a_lone_outcome_leaves_after_the_linger():
    c = Collect()
    reporter = Reporter(c.send, c.after, batch=50, linger=0.005)
    reporter.start()
    reporter.put(_outcome(1))
    assert c.sent.wait(10)
    assert c.batches == [[1]]
    assert reporter.pending() == 0
    reporter.close(10)


def test_outcomes_of_two_registrations_never_share_a_request():
    c = Collect()
    reporter = Reporter(c.send, c.after, batch=50, linger=60)
    for n, daemon_id in [(1, "7"), (2, "7"), (3, "8"), (4, "8"), (5, "7")]:
        reporter.put(_outcome(n, daemon_id=daemon_id))
    reporter.start()
    reporter.close(10)
    assert c.batches == [[1, 2], [3, 4], [5]]


class Server:
    """Answers complete requests with what the test sets, and records them."""

    def __init__(self, answer):
        self.answer = answer  # (request body) → httpx.Response
        self.requests: list[tuple[str, object]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.url.path, body))
        return self.answer(body)


@pytest.fixture
def daemon(monkeypatch):
    monkeypatch.setattr(calls, "BACKOFF_START", 0.01)  # read by Session.send

    def make(answer):
        server = Server(answer)
        client = Client("http://lakeshore.test", "t", transport=httpx.MockTransport(server.handle))
        lines: list[str] = []
        w = Worker(client, queues=["q"], log=lines.append, debug=lines.append)
        return w, server, lines

    return make


def _error(status: int, code: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message}})


def _per_item(body):
    answers = []
    for item in body:
        if item["invocation"] == 2:
            error = {"code": "claim_stale", "message": "Invocation 2 is no longer yours."}
            answers.append({"invocation": "2", "ok": False, "error": error})
        else:
            answers.append({"invocation": str(item["invocation"]), "ok": True, "state": "x"})
    return httpx.Response(200, json=answers)


def test_a_batch_is_one_request_and_each_outcome_is_fenced_alone(daemon):
    w, server, lines = daemon(_per_item)
    w.completer.send([_outcome(1), _outcome(2), _outcome(3, "failed")])
    assert len(server.requests) == 1
    url, body = server.requests[0]
    assert url == "/api/v1/daemons/7/complete/"
    assert body == [
        {"invocation": 1, "attempt": 1, "state": "succeeded", "result": {"n": 1}, "error": ""},
        {"invocation": 2, "attempt": 1, "state": "succeeded", "result": {"n": 2}, "error": ""},
        {"invocation": 3, "attempt": 1, "state": "failed", "result": None, "error": ""},
    ]
    assert w.completer.counts == {"succeeded": 1, "failed": 1, "timeout": 0, "killed": 0}
    assert "invocation 1: succeeded in 0.01 s" in lines
    assert "invocation 3: failed in 0.01 s" in lines
    assert (
        "invocation 2: outcome succeeded not recorded (the claim was taken away: "
        "Invocation 2 is no longer yours.)"
    ) in lines
    assert any(line.startswith("reported 3 outcome(s) in 1 request(s)") for line in lines)


def test_a_lone_outcome_goes_as_one_object(daemon):
    w, server, lines = daemon(lambda body: httpx.Response(200, json={"id": "1"}))
    w.completer.send([_outcome(1)])
    assert server.requests == [
        (
            "/api/v1/daemons/7/complete/",
            {"invocation": 1, "attempt": 1, "state": "succeeded", "result": {"n": 1}, "error": ""},
        )
    ]
    assert w.completer.counts["succeeded"] == 1


def test_a_server_that_refuses_lists_gets_one_request_per_outcome(daemon):
    def older_server(body):
        if isinstance(body, list):
            return _error(400, "invalid", "Expected a dictionary, but got list.")
        if body["invocation"] == 2:
            return _error(409, "claim_stale", "no longer yours")
        return httpx.Response(200, json={"id": str(body["invocation"])})

    w, server, lines = daemon(older_server)
    w.completer.send([_outcome(1), _outcome(2), _outcome(3)])
    assert [type(body).__name__ for _, body in server.requests] == ["list", "dict", "dict", "dict"]
    assert w.completer.counts["succeeded"] == 2
    assert (
        "invocation 2: outcome succeeded not recorded (the claim was taken away: no longer yours)"
    ) in lines


def test_a_daemon_no_longer_live_gets_nothing_recorded(daemon):
    w, server, lines = daemon(lambda body: _error(409, "daemon_lost", "marked lost"))
    w.completer.send([_outcome(1), _outcome(2)])
    assert len(server.requests) == 1
    assert w.completer.counts["succeeded"] == 0
    for n in (1, 2):
        assert f"invocation {n}: outcome succeeded not recorded (409 daemon_lost: marked lost)" in (
            lines
        )


KILLED_FIRST = {
    "code": "claim_stale",
    "message": "Invocation 2 was killed before this report came (…); the outcome …",
    "state": "killed",
    "reason": "stopped on daemon 7 by alice (daemon exec kill)",
}
SAYS_KILLED = (
    "invocation 2: outcome succeeded not recorded (killed on the server before this report "
    "came: stopped on daemon 7 by alice (daemon exec kill))"
)


def test_an_outcome_refused_as_killed_says_which_and_why_alone_or_in_a_batch(daemon):
    def killed_first(body):
        if isinstance(body, dict):  # a lone outcome: the 409 is the request's answer
            return httpx.Response(409, json={"error": KILLED_FIRST})
        answers = [{"invocation": "1", "ok": True, "state": "succeeded"}]
        answers.append({"invocation": "2", "ok": False, "error": KILLED_FIRST})
        return httpx.Response(200, json=answers)

    w, server, lines = daemon(killed_first)
    w.completer.send([_outcome(2)])
    w.completer.send([_outcome(1), _outcome(2)])
    assert lines.count(SAYS_KILLED) == 2, lines
    assert w.completer.counts["succeeded"] == 1


def test_a_batch_is_retried_whole_after_a_server_error(daemon):
    answers = iter([_error(503, "unavailable", "database down")])

    def flaky(body):
        return next(answers, None) or _per_item(body)

    w, server, lines = daemon(flaky)
    w.completer.send([_outcome(1), _outcome(3)])
    assert [body for _, body in server.requests][0] == [body for _, body in server.requests][1]
    assert len(server.requests) == 2
    assert w.completer.counts["succeeded"] == 2
    assert any("server error 503: database down; retrying in" in line for line in lines)
    assert any(line.startswith("reported 2 outcome(s) in 1 request(s)") for line in lines)


def test_a_heartbeat_carries_what_runs_and_what_is_not_yet_reported(daemon):
    w, server, lines = daemon(
        lambda body: httpx.Response(200, json={"state": "busy", "running": []})
    )
    w.session.daemon_id = "7"
    w.slots.claimed(0, [{"id": 12, "attempts": 1, "function": "f"}], "7")  # held: it runs
    w.reporter.put(_outcome(5))  # ended, its report not sent yet (the thread is not running)
    w.heartbeat.beat()
    assert server.requests == [("/api/v1/daemons/7/heartbeat/", {"held": [5, 12]})]


def test_a_server_that_refuses_held_ids_gets_heartbeats_without_them(daemon):
    def older_server(body):
        if body:
            return _error(400, "invalid", "Unknown field: held.")
        return httpx.Response(200, json={"state": "idle", "running": []})

    w, server, lines = daemon(older_server)
    w.session.daemon_id = "7"
    assert w.heartbeat.beat() == {"state": "idle", "running": []}
    assert w.heartbeat.beat() == {"state": "idle", "running": []}
    assert [body for _, body in server.requests] == [{"held": []}, None, None]
    assert any("refused held ids in heartbeats (Unknown field: held.)" in line for line in lines)
