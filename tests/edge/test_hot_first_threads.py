"""The web process's worker threads (edge/threads.py): each call goes to the
thread that finished last, at most max_workers run at once, the rest wait in order,
and errors reach the caller."""

import threading
import time

import pytest

from edge.threads import HotFirstExecutor


@pytest.fixture
def pool():
    executor = HotFirstExecutor(4, thread_name_prefix="test-hot")
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


def _start_all(pool, n):
    """n calls at once, so that n threads start; they end together."""
    gate = threading.Event()
    futures = [pool.submit(gate.wait, 10) for _ in range(n)]
    time.sleep(0.2)
    gate.set()
    assert all(f.result(10) for f in futures)


def test_after_a_burst_a_steady_load_runs_on_the_thread_that_finished_last(pool):
    _start_all(pool, 4)
    assert pool.started == 4
    ran_on = {pool.submit(threading.get_ident).result(5) for _ in range(50)}
    assert len(ran_on) == 1  # one warm thread, not the four in turn
    assert pool.started == 4


def test_no_more_than_max_workers_run_at_once(pool):
    gate = threading.Event()
    running = []
    lock = threading.Lock()
    peak = [0]

    def call(i):
        with lock:
            running.append(i)
            peak[0] = max(peak[0], len(running))
        gate.wait(10)
        with lock:
            running.remove(i)
        return i

    futures = [pool.submit(call, i) for i in range(10)]
    deadline = time.monotonic() + 10
    while len(running) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # room for a fifth, were one to start
    assert sorted(running) == [0, 1, 2, 3]  # four run; six wait
    gate.set()
    assert [f.result(10) for f in futures] == list(range(10))
    assert peak[0] == 4
    assert pool.started == 4


def test_calls_no_thread_was_free_for_run_in_the_order_they_came():
    pool = HotFirstExecutor(1, thread_name_prefix="test-hot-order")
    try:
        gate = threading.Event()
        ran = []
        pool.submit(gate.wait, 10)
        futures = [pool.submit(ran.append, i) for i in range(20)]
        gate.set()
        for future in futures:
            future.result(10)
        assert ran == list(range(20))
    finally:
        pool.shutdown()


def test_an_error_reaches_the_caller_and_the_thread_goes_on(pool):
    def boom():
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        pool.submit(boom).result(5)
    assert pool.submit(lambda: 7).result(5) == 7


def test_shutdown_ends_idle_threads_cancels_waiting_calls_and_refuses_new_ones():
    pool = HotFirstExecutor(1, thread_name_prefix="test-hot-stop")
    gate = threading.Event()
    first = pool.submit(gate.wait, 10)
    second = pool.submit(lambda: "ran")
    time.sleep(0.1)
    stopper = threading.Thread(target=pool.shutdown, kwargs={"cancel_futures": True})
    stopper.start()
    time.sleep(0.1)
    gate.set()
    stopper.join(10)
    assert not stopper.is_alive()  # the idle thread ended, so shutdown returned
    assert first.result(1) is True
    assert second.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
    assert not [t for t in threading.enumerate() if t.name.startswith("test-hot-stop")]
