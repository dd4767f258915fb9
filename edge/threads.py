"""The web process's worker threads (edge/application.py): a pool that hands each call
to the thread that went idle last, so a steady load runs on the few threads it needs
(warm: their stacks and connection handlers in the CPU's caches) and a burst still has
all of them. Why: docs/decisions/0003-hot-first-worker-threads.md."""

import threading
from collections import deque
from concurrent.futures import Executor, Future


class HotFirstExecutor(Executor):
    """Up to `max_workers` threads, started as calls need them; a call goes to the idle
    thread that finished last, else a new thread, else waits its turn (in order)."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "worker"):
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._max = max_workers
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # the one that went idle last at the end
        self._waiting: deque = deque()  # calls no thread was free for
        self._threads: list[threading.Thread] = []
        self._shutdown = False

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        call = (future, fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new calls after shutdown")
            if self._idle:
                self._idle.pop().hand(call)
            elif len(self._threads) < self._max:
                worker = _Worker(self, call)
                thread = threading.Thread(
                    target=worker.run,
                    name=f"{self._prefix}_{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()
            else:
                self._waiting.append(call)
        return future

    def next_call(self, worker: "_Worker"):
        """A worker's next call: one waiting, else the next handed to it once it is
        idle; None when the pool shuts down."""
        with self._lock:
            if self._waiting:
                return self._waiting.popleft()
            if self._shutdown:
                return None
            self._idle.append(worker)
        return worker.next()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._waiting:
                    self._waiting.popleft()[0].cancel()
            idle, self._idle = self._idle, []
            threads = list(self._threads)
        for worker in idle:
            worker.hand(None)
        if wait:
            for thread in threads:
                thread.join()

    @property
    def started(self) -> int:
        """Threads started so far."""
        with self._lock:
            return len(self._threads)


class _Worker:
    def __init__(self, pool: HotFirstExecutor, call):
        self._pool = pool
        self._call = call
        self._handed = threading.Semaphore(0)

    def hand(self, call) -> None:
        """Give an idle worker its next call (None: stop)."""
        self._call = call
        self._handed.release()

    def next(self):
        self._handed.acquire()
        return self._call

    def run(self) -> None:
        call, self._call = self._call, None
        while call is not None:
            future, fn, args, kwargs = call
            call = None  # hold no reference while idle
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - the caller's, through its future
                    future.set_exception(exc)
                    del exc
                else:
                    future.set_result(result)
                    del result
            del future, fn, args, kwargs
            call = self._pool.next_call(self)
