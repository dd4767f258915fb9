"""bench/fleet_swarm.py's own logic (the load generator of `make bench`'s idle-fleet
rows): it beats at the interval a real daemon picks, counts each event in the window it
belongs to, and reads percentiles by nearest rank. No server: a Worker is built but
never run."""

import time

import pytest

from bench.fleet_swarm import CLAIM_WAIT, HEARTBEAT_DEFAULT, Fleet, percentile, renew_interval
from lakeshore.client import Client
from lakeshore.worker.daemon import Worker


@pytest.mark.parametrize("timeout", [None, "60", 0, 60.0, 30.0, 12.0, 3.0, 2.0, 1.0])
def test_the_fleet_beats_at_the_interval_a_real_daemon_picks(timeout):
    daemon = Worker(Client("http://127.0.0.1:9", "token"), queues=[], log=lambda message: None)
    daemon._renew_within(timeout)
    assert renew_interval(timeout) == daemon.heartbeat_interval


def test_the_defaults_are_the_daemons_own():
    daemon = Worker(Client("http://127.0.0.1:9", "token"), queues=[], log=lambda message: None)
    assert daemon.heartbeat_interval == HEARTBEAT_DEFAULT  # --heartbeat's default too
    assert daemon.claim_wait == CLAIM_WAIT
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
