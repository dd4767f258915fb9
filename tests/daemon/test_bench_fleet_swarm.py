"""bench/fleet_swarm.py's own logic (the load generator of `make bench`'s idle-fleet
rows): it beats at the interval a real daemon picks and skips a heartbeat by the
daemon's own rule, counts each event (and each gap between renewals) in the window it
belongs to, reads percentiles by nearest rank, and after the last window stops as a
daemon does at its first SIGTERM (one drain, no new poll), a poll timed until its answer
or that end. No Lakeshore server: a Worker is built but never run; the heartbeats and
polls go to a small real HTTP server that answers 200."""

import asyncio
import json
import math
import time

import pytest

from bench import fleet_swarm
from bench.fleet_swarm import CLAIM_WAIT, HEARTBEAT_DEFAULT, Fleet, percentile, renew_interval
from lakeshore.client import Client
from lakeshore.worker import heartbeat
from lakeshore.worker.daemon import Worker
from tests.support import builders


@pytest.mark.parametrize("timeout", [None, "60", 0, 60.0, 30.0, 12.0, 3.0, 2.0, 1.0])
def test_the_fleet_beats_at_the_interval_a_real_daemon_picks(timeout):
    daemon = Worker(Client("http://127.0.0.1:9", "token"), queues=[], log=lambda message: None)
    daemon.heartbeat.renew_within(timeout)
    assert renew_interval(timeout) == daemon.heartbeat.interval


def test_the_defaults_are_the_daemons_own():
    daemon = Worker(Client("http://127.0.0.1:9", "token"), queues=[], log=lambda message: None)
    assert daemon.heartbeat.interval == HEARTBEAT_DEFAULT  # --heartbeat's default too
    assert daemon.claims.wait == CLAIM_WAIT
    assert renew_interval(3.0) < HEARTBEAT_DEFAULT  # a short timeout shortens it


def test_events_count_in_their_window_and_none_outside():
    start = time.monotonic() + 100
    fleet = Fleet({"base": "http://127.0.0.1:9", "start_at": start, "windows": 3, "window": 20.0})
    assert fleet.at(start - 0.001) is fleet.warm
    assert fleet.at(start) is fleet.windows[0]
    assert fleet.at(start + 19.999) is fleet.windows[0]
    assert fleet.at(start + 20) is fleet.windows[1]
    assert fleet.at(start + 59.999) is fleet.windows[2]
    assert fleet.at(start + 60) is fleet.after  # the tail: answers of the last polls only


def test_a_silence_counts_in_the_window_it_ends_in():
    start = time.monotonic() + 100
    fleet = Fleet({"base": "http://127.0.0.1:9", "start_at": start, "windows": 2, "window": 10})
    fleet.renew(7, start + 1)
    fleet.renew(7, start + 13.5)
    assert fleet.windows[1].silence == pytest.approx(12.5)
    assert fleet.windows[0].silence == 0


def test_percentiles_by_nearest_rank():
    values = [float(n) for n in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([3.0], 99) == 3.0
    assert percentile([2.0, 1.0], 99) == 2.0  # the slower of two
    assert percentile([], 99) is None


def test_gaps_between_renewals_count_in_the_window_they_end_in():
    start = time.monotonic() + 100
    fleet = Fleet({"base": "http://127.0.0.1:9", "start_at": start, "windows": 2, "window": 10})
    fleet.renew(1, start - 3)  # registered during the ramp
    fleet.renew(1, start + 2)  # a gap of 5 s ending in window 1
    fleet.renew(1, start + 7)
    fleet.renew(1, start + 12.5)  # ends in window 2
    fleet.renew(2, start + 19)
    fleet.renew(2, start + 24)  # ends after the last window: not counted
    assert fleet.windows[0].gaps == [5.0, 5.0]
    assert fleet.windows[1].gaps == [5.5]
    assert fleet.warm.gaps == [] and fleet.after.gaps == []


async def _http_server(answer: bytes, *, after: float = 0.0, received: list | None = None):
    """A real HTTP server on a free port: each request's JSON body goes to `received`
    (with the moment it came), and `after` seconds later the server answers 200
    `answer` and closes the connection. Answers (the server, its base URL)."""

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        body = await reader.readexactly(length)
        if received is not None:
            received.append((time.monotonic(), json.loads(body)))
        await asyncio.sleep(after)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(answer))
        writer.write(b"Connection: close\r\n\r\n" + answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _heartbeats_for(seconds: float, state: dict) -> Fleet:
    server, base = await _http_server(b"{}")
    fleet = Fleet({"base": base, "start_at": time.monotonic(), "windows": 1, "window": 60})
    fleet.interval = 0.05
    async with server, fleet.client("token") as client:
        beating = asyncio.create_task(fleet.heartbeats(client, 0, {"id": 1, **state}))
        await asyncio.sleep(seconds)
        beating.cancel()
        await asyncio.gather(beating, return_exceptions=True)
    return fleet


@pytest.mark.parametrize(
    ("state", "sends"),
    [
        ({"answered": math.inf, "busy": False}, False),  # idle, a poll always just answered
        ({"answered": -math.inf, "busy": False}, True),  # idle, no poll answered (control)
        ({"answered": math.inf, "busy": True}, True),  # holds a job to report (control)
    ],
)
def test_an_idle_daemon_whose_poll_was_answered_skips_its_heartbeat(state, sends):
    # 1.5 s of heartbeats every 0.05 s: some 30 ticks, 3 of them enough for what follows
    fleet = builders.run_async(_heartbeats_for(1.5, state))
    window = fleet.windows[0]
    if sends:
        assert len(window.beats) >= 3 and window.skipped == 0
        assert all(math.isfinite(beat) for beat in window.beats)
        assert len(window.gaps) >= 2  # each answered heartbeat renewed it
    else:
        assert window.beats == [] and window.skipped >= 3


def test_the_fleet_skips_by_the_daemons_own_rule():
    assert fleet_swarm.claims_renew is heartbeat.claims_renew


class _Registered(Exception):
    """Ends a daemon of the test fleet right after its registration."""


@pytest.mark.parametrize("bounded", [True, False])
def test_a_generator_has_at_most_its_bound_of_registrations_in_flight(monkeypatch, bounded):
    """A fleet that comes up faster than the server registers waits its turn: without
    the bound (the control) every daemon's registration is in flight at once."""
    if not bounded:
        monkeypatch.setattr(fleet_swarm, "REGISTERING_AT_ONCE", 1_000)
    daemons = 4 * fleet_swarm.REGISTERING_AT_ONCE if bounded else 40
    fleet = Fleet(
        {"base": "http://127.0.0.1:9", "token": "t", "ramp": 0, "windows": 1, "window": 1.0}
    )
    in_flight, most = 0, 0

    async def register(client, index):
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)  # the server's answer
        in_flight -= 1
        raise _Registered

    monkeypatch.setattr(fleet, "register", register)

    async def come_up():
        return await asyncio.gather(
            *(fleet.daemon(i) for i in range(daemons)), return_exceptions=True
        )

    ended = builders.run_async(come_up())
    assert all(isinstance(outcome, _Registered) for outcome in ended)
    assert most == (fleet_swarm.REGISTERING_AT_ONCE if bounded else daemons)


async def _stopping(end: bool, monkeypatch) -> tuple[list[dict], int, bool, bool]:
    """A fleet daemon's heartbeat and claim loops against a real HTTP server that records
    each body and answers each 50 ms later (a claim: empty); the last window ends
    (`stop_all`) after 0.3 s, or never (the control). Answers (the bodies, how many polls
    reached the server more than 0.1 s after the end (0.3 s: the control), whether the
    heartbeat loop ended, whether the claim loop did)."""
    monkeypatch.setattr(fleet_swarm, "DRAIN_SPREAD", 0.0)
    received: list[tuple[float, dict]] = []

    server, base = await _http_server(b"[]", after=0.05, received=received)
    fleet = Fleet({"base": base, "start_at": time.monotonic(), "windows": 1, "window": 60})
    fleet.interval = 30.0  # no heartbeat falls due in the test
    state = {"id": 1, "answered": math.inf, "busy": False, "again": False}
    async with server, fleet.client("token") as client:
        beating = asyncio.create_task(fleet.heartbeats(client, 0, state))
        claiming = asyncio.create_task(fleet.claims(client, 0, state))
        await asyncio.sleep(0.3)
        ended_at = time.monotonic()
        if end:
            await fleet.stop_all()
        await asyncio.sleep(0.5)
        ended = (beating.done(), claiming.done())
        for task in (beating, claiming):
            task.cancel()
        await asyncio.gather(beating, claiming, return_exceptions=True)
    late = [at for at, body in received if "drain" not in body and at > ended_at + 0.1]
    return [body for _, body in received], len(late), *ended


def test_after_the_last_window_each_daemon_drains_and_polls_no_more(monkeypatch):
    bodies, polls_after, beats_ended, claims_ended = builders.run_async(
        _stopping(True, monkeypatch)
    )
    assert [body for body in bodies if "drain" in body] == [{"held": [], "drain": True}]
    assert polls_after == 0
    assert beats_ended and claims_ended


def test_control_without_the_end_the_daemon_keeps_polling_and_never_drains(monkeypatch):
    bodies, polls_after, beats_ended, claims_ended = builders.run_async(
        _stopping(False, monkeypatch)
    )
    assert not any("drain" in body for body in bodies)
    assert polls_after >= 3  # a poll every 50 ms or so, on and on
    assert not beats_ended and not claims_ended


async def _one_slow_poll(window: float, monkeypatch) -> Fleet:
    """One poll, sent as the only window starts, that the server answers 0.6 s later,
    with a wait of 0.2 s (+ LATE 0.1 s): the fleet ends `window` seconds after it starts."""
    monkeypatch.setattr(fleet_swarm, "CLAIM_WAIT", 0.2)
    monkeypatch.setattr(fleet_swarm, "LATE", 0.1)
    monkeypatch.setattr(fleet_swarm, "DRAIN_SPREAD", 0.0)

    server, base = await _http_server(b"[]", after=0.6)
    fleet = Fleet({"base": base, "start_at": time.monotonic(), "windows": 1, "window": window})
    state = {"id": 1, "answered": -math.inf, "busy": False, "again": False}
    async with server, fleet.client("token") as client:
        claiming = asyncio.create_task(fleet.claims(client, 0, state))
        await asyncio.sleep(0.3)
        fleet.ending.set()  # the first poll is out; no other is sent
        await asyncio.wait_for(claiming, 5)
    return fleet


def test_a_poll_within_its_wait_when_the_fleet_stops_counts_as_held_in_time(monkeypatch):
    # Out 0.25 s when the window ends, within its 0.3 s; answered 0.6 s after it was sent.
    window = builders.run_async(_one_slow_poll(0.25, monkeypatch)).windows[0]
    assert (window.sent, window.answered, window.held, window.late) == (1, 1, 1, 0)


def test_control_a_poll_past_its_wait_before_the_end_counts_late(monkeypatch):
    # The fleet ends at 1 s: the poll's 0.6 s were all before it, past its 0.3 s.
    window = builders.run_async(_one_slow_poll(1.0, monkeypatch)).windows[0]
    assert (window.sent, window.answered, window.held, window.late) == (1, 1, 0, 1)


async def _stop_after_the_poll_came_back(monkeypatch) -> tuple[list[tuple[float, dict]], float]:
    """One whole fleet daemon (its registration skipped) whose polls come back 50 ms after
    they are sent, while its drain comes at the end of a DRAIN_SPREAD of 0.3 s: its claim
    loop ends first. Answers what the server received, and when the claim loop ended."""
    monkeypatch.setattr(fleet_swarm, "DRAIN_SPREAD", 0.3)
    monkeypatch.setattr(fleet_swarm.random, "uniform", lambda low, high: high)
    received: list[tuple[float, dict]] = []
    server, base = await _http_server(b"[]", after=0.05, received=received)
    fleet = Fleet(
        {
            "base": base,
            "token": "t",
            "ramp": 0,
            "start_at": time.monotonic(),
            "windows": 1,
            "window": 60,
        }
    )

    async def register(client, index):
        return {"id": 1}

    monkeypatch.setattr(fleet, "register", register)
    claims_ended = math.inf
    claims = fleet.claims

    async def timed_claims(*args):
        nonlocal claims_ended
        await claims(*args)
        claims_ended = time.monotonic()

    monkeypatch.setattr(fleet, "claims", timed_claims)
    async with server:
        daemon = asyncio.create_task(fleet.daemon(0))
        await asyncio.sleep(0.2)
        await fleet.stop_all()
        await asyncio.wait_for(daemon, 5)
    return received, claims_ended


def test_a_daemon_whose_poll_came_back_before_its_drain_still_drains(monkeypatch):
    received, claims_ended = builders.run_async(_stop_after_the_poll_came_back(monkeypatch))
    drains = [at for at, body in received if body == {"held": [], "drain": True}]
    assert len(drains) == 1
    assert claims_ended < drains[0]  # the interleaving: the claim loop had ended first
