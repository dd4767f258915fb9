"""Waiting claims sleep until their queues have work, without a database connection.
One thread per process LISTENs on `lakeshore_work` (the triggers of jobs/0004 send a
queue's name when work is queued there); a claim snapshots its queues' versions before
it looks and waits until one moves, so no notification is missed and a wait costs no
query. A waiter is a thread (`wait`) or a coroutine (`wait_async`: the edge's parked
waits); a notification wakes one relay at a time, a look that found a queue empty is
kept while the listener is connected, parked daemons are renewed together, and one-off
names (`inv:`, `frame:`, `log:`, `token:`, `user:`) wake every waiter of the name. Why
each, and how: docs/decisions/0005-waiting-on-notifications.md."""

import asyncio
import heapq
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from django.db import connection

from accounts.authentication import token_cache

CHANNEL = "lakeshore_work"
FALLBACK_POLL = 1.0
RECONNECT_DELAY = 1.0
RELAY = 4  # coroutines one notification, or one claim that took work, wakes per queue
EMPTY_MAX = 100_000  # queues whose emptiness a process keeps (past it: looked up each time)
STARTUP_WAIT = 5.0
CREDENTIALS = {"token": "token_id", "user": "user_id"}  # payloads that change no queue
ONE_OFF = ("inv", "frame", "log")  # one invocation's end, a stream's frames, a log's lines
FORGET_AFTER = 120.0  # seconds a one-off name nobody waits on is kept (waits are shorter)
# One-off names kept at most: past it a new name is not followed, and its waiter finds
# its end by its own looks (every few seconds), as if nothing were notified.
ONE_OFF_MAX = 100_000

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Renewal:
    """Something the listening thread renews on its waiters' behalf while they wait (a
    parked daemon's liveness: fleet/daemons.PARKED): every `every()` seconds it calls
    `renew(keys)`, in a thread of its own, with the keys of those waiting, so a
    thousand waiters cost one statement, not a thousand."""

    every: Callable[[], float]
    renew: Callable[[list[int]], None]


class Listener:
    def __init__(self):
        self._cond = threading.Condition()
        self._versions: dict[str, int] = {}
        self._due: list[tuple[float, str]] = []  # (epoch, queue) for back-off retries
        self._healthy = False
        self._thread: threading.Thread | None = None
        self._params: dict | None = None
        self._stop = threading.Event()
        self._tried = threading.Event()  # the first connection attempt is over
        self._released = 0  # bumped by release_waiters: every wait then ends empty
        self._closing = False  # close_waits: the server is stopping
        # coroutines waiting: by queue name, and all of them (for release and failure)
        self._parked: dict[str, dict] = {}  # insertion-ordered: the longest waiting first
        self._parked_all: set = set()
        # what waiters want renewed while they wait: Renewal → {key: waiters}
        self._renewing: dict[Renewal, Counter] = {}
        self._renewed: dict[Renewal, float] = {}  # Renewal → when it last ran (monotonic)
        self._renewals: dict[Renewal, threading.Thread] = {}  # the one running, if any
        self._touched: dict[str, float] = {}  # one-off name → when last waited on
        self._asleep: Counter = Counter()  # name → threads waiting on it (`wait`)
        self._forgot = time.monotonic()  # when one-off names were last forgotten
        # queue → (generation, version) at which a look found no queued row (note_empty)
        self._empty: dict[str, tuple[int, int]] = {}
        self._generation = 0  # bumped whenever the listener connects or loses its connection

    # ------------------------------------------------------------------ waiters

    def snapshot(self, queues: list[str]) -> tuple[int, ...]:
        self._ensure_started()
        with self._cond:
            self._touch(queues)
            return tuple(self._versions.get(q, 0) for q in queues)

    def _touch(self, names: list[str]) -> None:
        """One-off names among `names` are waited on now (up to ONE_OFF_MAX of them).
        Under self._cond."""
        now = None
        for name in names:
            if name.partition(":")[0] not in ONE_OFF:
                continue
            if name not in self._touched and len(self._touched) >= ONE_OFF_MAX:
                continue  # its waiter looks for itself
            now = now or time.monotonic()
            self._touched[name] = now
            self._versions.setdefault(name, 0)

    # ------------------------------------------------------------------ known empty

    def empty_mark(self, queues: list[str]):
        """Where `queues` stand, taken before a look for queued rows (note_empty)."""
        with self._cond:
            return self._generation, tuple(self._versions.get(q, 0) for q in queues)

    def note_empty(self, queues: list[str], mark) -> None:
        """A look that began after `mark` (empty_mark) found no queued row in `queues`.
        Kept only while the listener stays connected: a row queued since notifies its
        queue (the triggers of jobs/0004), which moves it past the mark."""
        generation, versions = mark
        with self._cond:
            if not self._healthy or generation != self._generation:
                return  # connected or lost since the mark: a notification may be lost
            for name, version in zip(queues, versions, strict=True):
                if name not in self._empty and len(self._empty) >= EMPTY_MAX:
                    continue  # its claims look for themselves
                self._empty[name] = (generation, version)

    def known_empty(self, queues: list[str]) -> bool:
        """Whether each of `queues` was found with no queued row (note_empty) and
        nothing was queued in it since: a long-poll's claim then need not look. A row
        committed but not yet heard of wakes the wait, as any notification does."""
        with self._cond:
            if not self._healthy or not queues:
                return False
            mark = self._generation
            return all(self._empty.get(q) == (mark, self._versions.get(q, 0)) for q in queues)

    def one_offs(self) -> int:
        """How many one-off names it keeps (waited on lately)."""
        with self._cond:
            return len(self._touched)

    def _forget(self) -> None:
        """Forget the one-off names nobody waited on for FORGET_AFTER seconds (every
        half of that at most). In the listening thread."""
        now = time.monotonic()
        if now - self._forgot < FORGET_AFTER / 2:
            return
        self._forgot = now
        with self._cond:
            for name, at in list(self._touched.items()):
                if (
                    now - at > FORGET_AFTER
                    and not self._parked.get(name)
                    and not self._asleep[name]
                ):
                    del self._touched[name]
                    self._versions.pop(name, None)
                    self._parked.pop(name, None)

    def wait(self, queues: list[str], seen: tuple[int, ...], timeout: float, renew=None) -> bool:
        """Wait up to `timeout` s for work in `queues` since `seen`. True when woken
        (or when the listener is down and it is time to look again). `renew`: (a
        Renewal, a key) renewed while it waits."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._touch(queues)
            self._asleep.update(queues)
            self._renew_add(renew)
            try:
                released = self._released
                while True:
                    if self._released != released or self._closing:
                        return False
                    if tuple(self._versions.get(q, 0) for q in queues) != seen:
                        return True
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    if not self._healthy:
                        self._cond.wait(min(left, FALLBACK_POLL))
                        return self._released == released
                    self._cond.wait(left)
            finally:
                self._renew_drop(renew)
                self._asleep.subtract(queues)
                for name in queues:
                    if self._asleep[name] <= 0:
                        del self._asleep[name]

    async def wait_async(
        self, queues: list[str], seen: tuple[int, ...], timeout: float, renew=None
    ) -> bool:
        """`wait` for a coroutine: the same answers, no thread held. (The snapshot
        taken before it started the listening thread.)"""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        waiter = (loop, future)
        with self._cond:
            if self._closing:
                return False
            self._touch(queues)
            if tuple(self._versions.get(q, 0) for q in queues) != seen:
                return True
            healthy = self._healthy
            for name in queues:
                self._parked.setdefault(name, {})[waiter] = None
            self._parked_all.add(waiter)
            self._renew_add(renew)
        try:
            return await asyncio.wait_for(
                future, timeout if healthy else min(timeout, FALLBACK_POLL)
            )
        except TimeoutError:
            return not healthy  # the listener is down: time to look again
        finally:
            with self._cond:
                self._renew_drop(renew)
                self._parked_all.discard(waiter)
                for name in queues:
                    waiting = self._parked.get(name)
                    if waiting is not None:
                        waiting.pop(waiter, None)
                        if not waiting:
                            del self._parked[name]

    def _renew_add(self, renew) -> None:
        """Under self._cond."""
        if renew is not None:
            renewal, key = renew
            self._renewing.setdefault(renewal, Counter())[key] += 1
            self._renewed.setdefault(renewal, time.monotonic())

    def _renew_drop(self, renew) -> None:
        """Under self._cond."""
        if renew is not None:
            renewal, key = renew
            keys = self._renewing[renewal]
            keys[key] -= 1
            if keys[key] <= 0:
                del keys[key]

    def renewing(self, renewal: Renewal) -> list[int]:
        """The keys renewed now for `renewal` (those of its waiters)."""
        with self._cond:
            return sorted(self._renewing.get(renewal, ()))

    def _renew_due(self) -> float:
        """Start each Renewal whose time has come, for the keys of its waiters, in a
        thread of its own (this thread goes on listening: a statement on the listening
        connection could lose notifications); seconds until the next one is due."""
        now = time.monotonic()
        soonest = 1.0
        with self._cond:
            due = list(self._renewed.items())
        for renewal, last in due:
            every = renewal.every()
            if now - last >= every:
                self._renewed[renewal] = last = now
                keys = self.renewing(renewal)
                running = self._renewals.get(renewal)
                if keys and (running is None or not running.is_alive()):
                    thread = threading.Thread(
                        target=_renew, args=(renewal, keys), name="lakeshore-renew", daemon=True
                    )
                    self._renewals[renewal] = thread
                    thread.start()
            soonest = min(soonest, max(0.01, every - (now - last)))
        return soonest

    @property
    def healthy(self) -> bool:
        """Whether it is connected and listening (starting it if need be)."""
        self._ensure_started()
        return self._healthy

    @property
    def closing(self) -> bool:
        """close_waits was called: the server is stopping (a wait that looks again on a
        timer, the SDK's await and stream, stops rather than wait again)."""
        return self._closing

    def _wake_parked(self, waiters, value: bool) -> None:
        """Settle coroutines' futures from this (any) thread. Under self._cond."""
        for loop, future in list(waiters):
            loop.call_soon_threadsafe(_settle, future, value)

    def close_waits(self) -> None:
        """The server is stopping: every wait in progress ends now, and every later one
        at once, as if its time were up."""
        with self._cond:
            self._closing = True
        self.release_waiters()

    def release_waiters(self) -> None:
        """End every wait in progress as if its time were up (its claim answers empty,
        touching nothing more); later waits are not affected. For a server shutting
        down, and for tests whose daemons are gone."""
        with self._cond:
            self._released += 1
            self._cond.notify_all()
            self._wake_parked(self._parked_all, False)

    # ------------------------------------------------------------------ the thread

    def _ensure_started(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            self._params = _connection_params()
            self._tried.clear()
            self._thread = threading.Thread(target=self._run, name="lakeshore-listen", daemon=True)
            self._thread.start()
        # The first waiter waits for the connection, rather than fall back to polling.
        self._tried.wait(STARTUP_WAIT)

    def stop(self, timeout: float = 3.0) -> None:
        """Close the listening connection (the test session does, before it drops its
        database); the next waiter starts a new one."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout)
        self._stop.clear()
        self._thread = None

    def _bump(self, name: str) -> None:
        """Under self._cond."""
        self._versions[name] = self._versions.get(name, 0) + 1
        self._wake_next(name)

    def _wake_next(self, name: str) -> None:
        """Wake the RELAY coroutines that waited longest on `name`. Under self._cond."""
        waiting = self._parked.get(name)
        if waiting:
            woken = []
            for waiter in waiting:
                woken.append(waiter)
                if len(woken) == RELAY:
                    break
            for waiter in woken:
                del waiting[waiter]  # woken once: the next relay wakes others
            self._wake_parked(woken, True)

    def relay(self, queues: list[str]) -> None:
        """A claim took work from `queues`: there may be more, so wake the next waiters
        (coroutines only: waiting threads wake on every notification)."""
        with self._cond:
            for name in queues:
                self._wake_next(name)

    def _receive(self, payload: str) -> None:
        kind, _, key = payload.partition(":")
        if kind in CREDENTIALS and key.isdigit():  # a token or a user changed
            token_cache.forget(**{CREDENTIALS[kind]: int(key)})
            return
        if kind in ONE_OFF:  # an invocation's end, a stream's frame: all its waiters
            with self._cond:
                if payload in self._touched:  # else nobody waits on it
                    self._versions[payload] = self._versions.get(payload, 0) + 1
                    self._wake_parked(list(self._parked.pop(payload, {})), True)
                    self._cond.notify_all()
            return
        name, _, at = payload.partition("@")
        with self._cond:
            if at:
                try:
                    heapq.heappush(self._due, (float(at), name))
                except ValueError:
                    self._bump(name)
            else:
                self._bump(name)
            self._cond.notify_all()

    def _fire_due(self) -> float:
        """Bump queues whose back-off ended; seconds until the next one (or 1 s)."""
        now = time.time()
        with self._cond:
            fired = False
            while self._due and self._due[0][0] <= now:
                self._bump(heapq.heappop(self._due)[1])
                fired = True
            if fired:
                self._cond.notify_all()
            return min(1.0, self._due[0][0] - now) if self._due else 1.0

    def _set_health(self, healthy: bool) -> None:
        token_cache.watch(healthy)  # it hears tokens' and users' changes, or no longer
        with self._cond:
            self._healthy = healthy
            self._generation += 1
            self._empty.clear()  # notifications may have been missed: look again
            self._tried.set()
            if not healthy:
                self._cond.notify_all()  # waiters switch to polling now
                self._wake_parked(self._parked_all, True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(**self._params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._set_health(True)
                    # Anything sent while we were away: wake everyone once.
                    with self._cond:
                        for name in list(self._versions):
                            self._bump(name)
                        self._cond.notify_all()
                    while not self._stop.is_set():
                        turn = min(self._fire_due(), self._renew_due())
                        for note in conn.notifies(timeout=max(0.01, turn)):
                            self._receive(note.payload)
                        self._fire_due()
                        self._forget()
            except Exception as exc:  # noqa: BLE001 - keep listening whatever happens
                log.warning("work listener: %s; reconnecting", exc)
            self._set_health(False)
            self._stop.wait(RECONNECT_DELAY)


def _renew(renewal: Renewal, keys: list[int]) -> None:
    try:
        renewal.renew(keys)
    except Exception as exc:  # noqa: BLE001 - tried again at its next turn
        log.warning("renewing %d waiters: %s", len(keys), exc)


def _settle(future: asyncio.Future, value: bool) -> None:
    if not future.done():
        future.set_result(value)


def _connection_params() -> dict:
    """The database Django uses (the test database under pytest), minus Django's own
    cursor and adapter plumbing."""
    params = dict(connection.get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    return params


listener = Listener()
