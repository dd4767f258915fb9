"""Heavy requests: at most LAKESHORE_HEAVY_PER_PRINCIPAL of one user's run at once in a
server process.

A heavy request holds a database connection and a worker thread for long: an apply of
a lakeshore.yaml (up to LAKESHORE_APPLY_MAX_ITEMS providers and queues, in one
transaction), a bulk cancel (every queued invocation of a queue, in batches), an export
(every provider and queue). One caller sending many at once would take the share of
the pool every other caller's requests use (lakeshore_admin/dbpool.py). So each user
runs at most this many at a time, whichever doors they come in by (the API, with any
of the user's tokens, or the console): one more is refused at once, 429 `busy` with
Retry-After, and nothing of it is done. Other users are not held back.

The count is per process (gunicorn's workers are processes), as the wait slots of
jobs/waits.py are."""

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator

from django.conf import settings

from lakeshore_admin.errors import TooManyAtOnce

RETRY_AFTER = 2  # seconds: a heavy request takes about this long or more


class HeavyRequests:
    """The heavy requests running in this process, counted by user."""

    def __init__(self):
        self._lock = threading.Lock()
        self.running: Counter = Counter()  # user id → heavy requests running

    @contextlib.contextmanager
    def one_of(self, user) -> Iterator[None]:
        """`with heavy.requests.one_of(request.user):` around a heavy request's work;
        TooManyAtOnce when the user already runs as many as they may."""
        limit = settings.LAKESHORE_HEAVY_PER_PRINCIPAL
        with self._lock:
            if self.running[user.pk] >= limit:
                raise TooManyAtOnce(
                    f"You already have {limit} heavy request{'s' if limit > 1 else ''} "
                    "(apply, bulk cancel, export) running on this server "
                    "(LAKESHORE_HEAVY_PER_PRINCIPAL); try again when one has ended.",
                    retry_after=RETRY_AFTER,
                )
            self.running[user.pk] += 1
        try:
            yield
        finally:
            with self._lock:
                self.running[user.pk] -= 1
                if not self.running[user.pk]:
                    del self.running[user.pk]


requests = HeavyRequests()
