"""Admission of waits: at most LAKESHORE_MAX_WAITS requests of a server process sleep
at once, so long-polls never take every thread.

A long-poll holds a server thread while it sleeps (no database connection: see
jobs/wakeup.py). Gunicorn gives a process a fixed number of threads (gunicorn_conf.py):
were they all asleep in long-polls, a heartbeat, a completion or a console page would
queue behind them, and the reaper would mark healthy daemons lost. So every path that
sleeps in a request takes a slot first, without blocking, and gives it back when it
wakes:

    claim / exchange with `wait` (jobs/services.invocation_claim; the SDK's poll too)
    the SDK's await (jobs/sdk.await_result) and result stream (jobs/sdk.open_frames)

A wait refused a slot does not sleep: a claim answers what it found at once (nothing)
with `Retry-After` (the seconds it asked to wait: it would have looked again no sooner;
the daemon adds jitter), the SDK's poll answers no command, its await the current
state, and a stream that would have to wait answers 503 `busy` with `Retry-After`.
Heartbeats, completions and everything else never sleep, so they never need a slot.

The count is per process (gunicorn's workers are processes): a server admits
workers × LAKESHORE_MAX_WAITS waits in all."""

import contextlib
import math
import threading
from collections.abc import Iterator

from django.conf import settings

RETRY_AFTER_MAX = 30  # seconds: no refused wait is told to stay away longer


class Slots:
    """A bounded counter: `take` never blocks; it says whether a slot was free."""

    def __init__(self):
        self._lock = threading.Lock()
        self.held = 0
        self.refused = 0  # waits refused since the process started

    def take(self) -> bool:
        with self._lock:
            if self.held >= settings.LAKESHORE_MAX_WAITS:
                self.refused += 1
                return False
            self.held += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.held -= 1

    @contextlib.contextmanager
    def admit(self) -> Iterator[bool]:
        """`with slots.admit() as admitted:` sleep only when admitted; the slot (if
        any) is given back when the block ends, however it ends."""
        admitted = self.take()
        try:
            yield admitted
        finally:
            if admitted:
                self.release()


slots = Slots()


class Claimed(list):
    """What a claim found. `retry_after` (seconds) is set when its wait was refused a
    slot: the answer says when to claim again (the `Retry-After` header)."""

    retry_after: int | None = None


def refused(found: list, wait: float) -> Claimed:
    """The answer of a claim whose wait of `wait` s was refused: what it found, and
    when to come back."""
    answer = Claimed(found)
    answer.retry_after = retry_after(wait)
    return answer


def retry_after(wait: float) -> int:
    """Whole seconds (HTTP's Retry-After), at least 1."""
    return max(1, min(RETRY_AFTER_MAX, math.ceil(wait)))


def headers(claimed: list) -> dict[str, str]:
    """The HTTP headers a claim's answer carries: `Retry-After` when its wait was
    refused (both doors of the daemon protocol send it: the DRF views and the lean
    path)."""
    seconds = getattr(claimed, "retry_after", None)
    return {"Retry-After": str(seconds)} if seconds else {}


class Holding:
    """An iterator that holds a slot until it is closed (a streamed response: the
    server closes it when the stream ends or the client goes, started or not)."""

    def __init__(self, iterator: Iterator, held: bool):
        self._iterator = iterator
        self._held = held

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._iterator)

    def close(self) -> None:
        try:
            close = getattr(self._iterator, "close", None)
            if close is not None:
                close()
        finally:
            if self._held:
                self._held = False
                slots.release()
