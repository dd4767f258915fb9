"""How far the daemon is from stopping: three flags that any thread may set and every
part of the daemon reads, so that each part decides for itself when to give up."""

import threading


class Stopping:
    """The daemon's stop flags.

    `draining`: claim no more and leave once idle (the first signal, or the server
    asked). `dropped`: the server let go of this daemon: leave now, reporting nothing
    more. `hard`: stop what runs now (the second signal, or the daemon is leaving)."""

    def __init__(self) -> None:
        self.draining = threading.Event()
        self.dropped = threading.Event()
        self.hard = threading.Event()

    def any(self) -> bool:
        """Whether the daemon is on its way out, for whatever reason."""
        return self.draining.is_set() or self.dropped.is_set() or self.hard.is_set()

    def leaving_now(self) -> bool:
        """Whether what runs is to be left (dropped, or a hard stop)."""
        return self.hard.is_set() or self.dropped.is_set()
