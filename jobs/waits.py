"""Admission of waits: at most LAKESHORE_MAX_WAITS requests of a server process sleep
at once, so long-polls never take every thread.

A long-poll holds a server thread while it sleeps (no database connection: see
jobs/wakeup.py). Gunicorn gives a process a fixed number of threads (gunicorn_conf.py):
were they all asleep in long-polls, a heartbeat, a completion or a console page would
queue behind them, and the reaper would mark healthy daemons lost. So every path that
sleeps in a request takes a slot first, without blocking, and gives it back when it
wakes:

    claim / exchange with `wait` (fleet/protocol.claim_steps; the SDK's poll too)
    the SDK's await (jobs/sdk.await_result) and result stream (jobs/sdk.open_frames)

A wait refused a slot does not sleep: a claim answers what it found at once (nothing)
with `Retry-After` (the seconds it asked to wait: it would have looked again no sooner;
the daemon adds jitter), the SDK's poll answers no command, its await the current
state, and a stream that would have to wait answers 503 `busy` with `Retry-After`.
Heartbeats, completions and everything else never sleep, so they never need a slot.

The count is per process (gunicorn's workers are processes): a server admits
workers × LAKESHORE_MAX_WAITS waits in all.

Under the ASGI server (lakeshore_admin/asgi.py) a daemon's claim and exchange, the SDK's
poll, await and result stream, and a log follow hold no thread while they wait: their
services are written as steps (a generator that yields a Wait where it would sleep),
which `drive` runs in a thread, sleeping there, and `drive_async` runs on the event
loop, each step in a thread and each wait a coroutine. Those waits are bounded by
LAKESHORE_MAX_PARKED a process instead: they cost memory, not threads.

Each bound has a share per principal too (issue 29): one token (or a console user)
holds at most LAKESHORE_MAX_WAITS_PER_PRINCIPAL of a process's thread waits and
LAKESHORE_MAX_PARKED_PER_PRINCIPAL of its parked ones. Past its share, its wait is
refused as past the whole bound (a claim answers at once with Retry-After, a follow
what it has), while other principals still wait: one viewer's follows, or one
daemon's claims, cannot take the room of the fleet. A daemon waits once at a time; an
SDK worker a few."""

import asyncio
import contextlib
import math
import threading
from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass

from django.conf import settings

from accounts import audit
from jobs import wakeup

RETRY_AFTER_MAX = 30  # seconds: no refused wait is told to stay away longer
# The key of a request's environ (its META) under which the ASGI server notes when it
# took the request (time.monotonic()): a long-poll's wait counts from then, so time it
# spent queued for a worker thread is not added to it (fleet/protocol.claim_steps).
ARRIVED = "lakeshore.arrived"


def arrived(request) -> float | None:
    """When the server took `request`, if it noted it (ARRIVED)."""
    return request.META.get(ARRIVED)


def principal(request) -> tuple[str, int] | None:
    """Whose wait a request's is: its bearer token (each daemon's credential is its
    own), else its signed-in user (a console session); None for nobody's."""
    if request is None:
        return None
    token = getattr(request, "auth", None)
    if getattr(token, "pk", None) is not None:
        return "token", token.pk
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return "user", user.pk
    return None


def serving_principal() -> tuple[str, int] | None:
    """The principal of the request this thread serves (the audit trail keeps it)."""
    return principal(audit.serving_request())


class _Shares:
    """How many waits each principal holds, within `share` (a setting's name)."""

    def __init__(self, share: str):
        self.share = share
        self.held: dict[tuple[str, int], int] = {}

    def full(self, who) -> bool:
        return who is not None and self.held.get(who, 0) >= getattr(settings, self.share)

    def take(self, who) -> None:
        if who is not None:
            self.held[who] = self.held.get(who, 0) + 1

    def release(self, who) -> None:
        if who is not None:
            left = self.held[who] - 1
            if left:
                self.held[who] = left
            else:
                del self.held[who]


class Slots:
    """A bounded counter: `take` never blocks; it says whether a slot was free, within
    the whole bound and the principal's share."""

    def __init__(self):
        self._lock = threading.Lock()
        self.held = 0
        self.refused = 0  # waits refused since the process started
        self.shares = _Shares("LAKESHORE_MAX_WAITS_PER_PRINCIPAL")

    def take(self, who=None) -> bool:
        with self._lock:
            if self.held >= settings.LAKESHORE_MAX_WAITS or self.shares.full(who):
                self.refused += 1
                return False
            self.held += 1
            self.shares.take(who)
            return True

    def release(self, who=None) -> None:
        with self._lock:
            self.held -= 1
            self.shares.release(who)

    @contextlib.contextmanager
    def admit(self, who=None) -> Iterator[bool]:
        """`with slots.admit(who) as admitted:` sleep only when admitted; the slot (if
        any) is given back when the block ends, however it ends."""
        admitted = self.take(who)
        try:
            yield admitted
        finally:
            if admitted:
                self.release(who)


slots = Slots()


class Parked:
    """The count of waits parked on an event loop (no thread each), bounded by
    LAKESHORE_MAX_PARKED and each principal's share. Touched from the loop's thread
    only."""

    def __init__(self):
        self.held = 0
        self.refused = 0
        self.shares = _Shares("LAKESHORE_MAX_PARKED_PER_PRINCIPAL")

    def take(self, who=None) -> bool:
        if self.held >= settings.LAKESHORE_MAX_PARKED or self.shares.full(who):
            self.refused += 1
            return False
        self.held += 1
        self.shares.take(who)
        return True

    def release(self, who=None) -> None:
        self.held -= 1
        self.shares.release(who)


parked = Parked()


@dataclass(frozen=True)
class Wait:
    """Where a long-poll's steps would sleep: until one of `queues` moves past `seen`
    (jobs/wakeup.py), or `seconds` pass. `renew`: (a wakeup.Renewal, a key) renewed
    while it waits (a parked daemon's liveness)."""

    queues: list[str]
    seen: tuple[int, ...]
    seconds: float
    renew: tuple[wakeup.Renewal, int] | None = None
    # its time run out (or the waits released), the steps end with no query: drive_async
    # runs that last step on the event loop rather than take a worker thread's turn
    ends_quietly: bool = False


class Gone(Exception):  # noqa: N818 - what happened, not a failure
    """The client went away while its steps waited: they were closed, and there is no
    answer to send."""


Steps = Generator[Wait, bool | None, object]


def drive(steps: Steps):
    """Run long-poll steps in this thread, sleeping where they wait (a slot first, for
    the principal of the request served: a wait refused one is sent None). Returns what
    the steps return."""
    who = serving_principal()
    try:
        wait = next(steps)
        while True:
            with slots.admit(who) as admitted:
                woken = (
                    wakeup.listener.wait(wait.queues, wait.seen, wait.seconds, wait.renew)
                    if admitted
                    else None
                )
            wait = steps.send(woken)
    except StopIteration as done:
        return done.value


_DONE = object()


def _step(steps: Steps, value):
    """One step, in a worker thread: (_DONE, result) when the steps end (a StopIteration
    may not cross into a Future)."""
    try:
        return steps.send(value)
    except StopIteration as done:
        return _DONE, done.value


def first_step(steps: Steps):
    """The steps' first step (in a worker thread), for drive_async's `first`."""
    return _step(steps, None)


async def drive_async(
    steps: Steps,
    run: Callable[..., Awaitable],
    *,
    first=None,
    gone: asyncio.Future | None = None,
    who: tuple[str, int] | None = None,
):
    """Run long-poll steps on the event loop: each step through `run` (a worker thread:
    they touch the database), each wait a coroutine holding no thread. `first`: what
    first_step answered, when the caller ran it. `gone`: done when the client goes away;
    then the steps are closed where they wait (a claim woken after its daemon went
    would take work for nobody) and Gone is raised. `who`: the request's principal
    (principal()), whose share each wait counts in. Returns what the steps return."""
    got = first if first is not None else await run(_step, steps, None)
    while not (isinstance(got, tuple) and len(got) == 2 and got[0] is _DONE):
        if parked.take(who):
            try:
                woken = await _wait(got, gone)
            except Gone:
                await run(steps.close)
                raise
            finally:
                parked.release(who)
        else:
            woken = None
        if woken is False and got.ends_quietly:
            got = _step(steps, woken)  # no query (Wait.ends_quietly): no thread's turn
        else:
            got = await run(_step, steps, woken)
    return got[1]


async def _wait(wait: Wait, gone: asyncio.Future | None) -> bool:
    waiting = wakeup.listener.wait_async(wait.queues, wait.seen, wait.seconds, wait.renew)
    if gone is None:
        return await waiting
    if gone.done():
        waiting.close()
        raise Gone
    task = asyncio.ensure_future(waiting)
    await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise Gone


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
    """An iterator that holds a slot (of principal `who`) until it is closed (a
    streamed response: the server closes it when the stream ends or the client goes,
    started or not)."""

    def __init__(self, iterator: Iterator, held: bool, who=None):
        self._iterator = iterator
        self._held = held
        self._who = who

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
                slots.release(self._who)
