"""The daemon's log shipper (lakeshore.worker.logs) without a server: its `call` is a
stand-in that records what would go out, or blocks as the Worker's retries do while
the server is unreachable."""

import threading
import time

from lakeshore.errors import ApiError
from lakeshore.joblog import LogBook
from lakeshore.pool.job_process import Running
from lakeshore.worker.logs import Shipper
from lakeshore.worker.reporting import Outcome


class Server:
    def __init__(self, delay: float = 0.0):
        self.sent: list[tuple[str, dict]] = []
        self.reachable = threading.Event()
        self.reachable.set()
        self.delay = delay  # a request's round trip

    def call(self, method, url, body):
        self.reachable.wait(10)  # the Worker's call retries until the server answers
        time.sleep(self.delay)
        self.sent.append((url, body))
        return [{"status": "stored"} for _ in body["chunks"]]

    def lines(self) -> list[str]:
        return [line[2] for _, body in self.sent for c in body["chunks"] for line in c["lines"]]


def make(server, book=None, ready=None, log=None):
    shipper = Shipper(
        book or LogBook(),
        server.call,
        ready=ready or (lambda outcomes: None),
        log=log or (lambda message: None),
        every=0.05,
    )
    shipper.start()
    return shipper


def item(n: int, daemon="d1") -> Running:
    return Running({"id": n, "attempts": 1}, daemon_id=daemon)


def wait_for(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_lines_go_to_their_registrations_route_within_the_interval():
    server, book = Server(), LogBook()
    shipper = make(server, book)
    book.add((7, 1), "d1", "o", ["a", "b"])
    book.add((8, 1), "d2", "e", ["c"])
    wait_for(lambda: len(server.lines()) == 3)
    shipper.close(2)
    urls = sorted(url for url, _ in server.sent)
    assert urls == ["daemons/d1/logs/", "daemons/d2/logs/"]


def test_an_outcome_waits_for_its_jobs_last_lines():
    server, book = Server(), LogBook()
    released = []
    shipper = make(server, book, ready=released.extend)
    server.reachable.clear()  # the server is away: the lines cannot go yet
    book.add((7, 1), "d1", "o", ["the last words"])
    outcome = Outcome(item(7), "failed", None, "boom", 0.1)
    assert shipper.then_report(outcome) and outcome.ready is False
    time.sleep(0.3)
    assert released == []  # not reported before its lines
    server.reachable.set()
    wait_for(lambda: released == [outcome])
    assert server.lines() == ["the last words"]
    silent = Outcome(item(9), "succeeded", None, "", 0.1)
    assert not shipper.then_report(silent) and silent.ready  # nothing to wait for
    shipper.close(2)


def test_an_outcome_waits_for_its_last_lines_already_on_their_way():
    """The lines were taken and sent before the job ended; their request is still out
    when its outcome comes. The outcome once went at once (nothing waited in the book),
    reached the server first, and `jobs logs --follow` ended without the last lines."""
    server, book = Server(), LogBook()
    released = []
    shipper = make(server, book, ready=released.extend)
    server.reachable.clear()  # the request carrying the lines is out and not answered
    book.add((7, 1), "d1", "o", ["tick 14"])
    wait_for(lambda: book.in_flight() == 1)
    outcome = Outcome(item(7), "succeeded", None, "", 0.1)
    assert shipper.then_report(outcome) and outcome.ready is False
    time.sleep(0.3)
    assert released == []  # not reported before its lines landed
    server.reachable.set()
    wait_for(lambda: released == [outcome])
    assert server.lines() == ["tick 14"]
    # the control: once the lines have landed, the next outcome of that attempt goes at once
    again = Outcome(item(7), "succeeded", None, "", 0.1)
    assert not shipper.then_report(again) and again.ready
    shipper.close(2)


def test_while_the_server_is_away_it_keeps_a_bounded_buffer_and_says_what_it_dropped():
    server, book = Server(), LogBook(max_bytes=200, head_keep=30)  # 3 lines
    said = []
    shipper = make(server, book, log=said.append)
    server.reachable.clear()
    book.add((7, 1), "d1", "o", ["000000000"])  # taken at once, then stuck in flight
    wait_for(lambda: book.in_flight() == 1)
    for i in range(1, 101):
        book.add((7, 1), "d1", "o", [f"{i:09d}"])
    assert book.bytes <= 200
    server.reachable.set()
    wait_for(lambda: server.lines() and server.lines()[-1] == "000000100")
    shipper.close(2)
    chunks = [c for _, body in server.sent for c in body["chunks"]]
    assert sum(c["dropped"] for c in chunks) == book.dropped > 0
    assert len(server.lines()) + book.dropped == 101  # every line shipped or counted
    assert server.lines()[:3] == ["000000000", "000000001", "000000002"]  # the head kept
    assert any("dropped" in message for message in said)


def test_an_outcome_goes_while_another_job_keeps_printing():
    """The shipper once drained the book before releasing outcomes: a job that never
    stopped printing held every other job's outcome until the daemon stopped."""
    server, book = Server(delay=0.01), LogBook()  # lines come in while a request is out
    released = []
    shipper = make(server, book, ready=released.extend)
    stop = threading.Event()

    def chatter():
        i = 0
        while not stop.is_set():
            book.add((8, 1), "d1", "o", [f"chatter {i}"] * 50)
            i += 1
            time.sleep(0.001)

    noisy = threading.Thread(target=chatter)
    noisy.start()
    try:
        book.add((7, 1), "d1", "o", ["done"])
        outcome = Outcome(item(7), "succeeded", None, "", 0.1)
        shipper.then_report(outcome)
        wait_for(lambda: released == [outcome], timeout=3)
    finally:
        stop.set()
        noisy.join()
        shipper.close(2)


class ClosingServer(Server):
    """Refuses a shipment whole while it holds a chunk of a closed attempt, as the server
    answers 409 log_closed (jobs/logs.py), naming those attempts."""

    def __init__(self, closed: set[tuple[int, int]]):
        super().__init__()
        self.closed = closed
        self.refused = 0

    def call(self, method, url, body):
        named = sorted({(c["invocation"], c["attempt"]) for c in body["chunks"]} & self.closed)
        if named:
            self.refused += 1
            closed = [{"invocation": pk, "attempt": attempt} for pk, attempt in named]
            error = {"code": "log_closed", "message": "closed", "closed": closed}
            raise ApiError(409, "log_closed", "closed", detail=error)
        return super().call(method, url, body)


def test_a_shipment_refused_for_a_closed_attempt_goes_again_without_it():
    server, book, said = ClosingServer({(7, 1)}), LogBook(), []
    shipper = make(server, book, log=said.append)
    book.add((7, 1), "d1", "o", ["late"])
    book.add((8, 1), "d1", "o", ["live"])
    wait_for(lambda: server.lines() == ["live"])
    shipper.close(2)
    assert server.refused == 1  # once: the rest went on the second try
    assert any("refused (log_closed)" in line for line in said)
    assert any("late" in line for line in said)  # the refused lines: in the daemon's own log
