"""A hot route: a request the edge (edge/application.py) may serve by a door of its own
rather than Django's full stack. Each app declares its hot routes next to its API
(fleet/api/routes.py, jobs/api/routes.py), and the edge reads those declarations: the
method, the path, the DRF view whose permission classes admit the request, and what
answers it. Everything a door does not take, Django serves through the same view."""

import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class HotRoute:
    """`door`: which of the edge's doors serves it: "lean" (edge/lean_path.py: `answer`,
    or `steps` for a long-poll), "sdk-poll" (edge/sdk_poll.py), "await", "stream" or
    "follow" (edge/streams.py). `path`'s named groups are the view's arguments.
    `before_body`: what is checked of the caller before the body is read, given the
    request and the arguments (a daemon's credential on its own daemon's path);
    `on_arrival`: what is noted in the request's environ as it arrives, before its
    credential is read, given the environ and the arguments."""

    name: str
    method: str
    path: re.Pattern[str]
    view: type
    door: str
    answer: Callable | None = None
    steps: Callable | None = None
    before_body: Callable | None = None
    on_arrival: Callable | None = None

    def arguments(self, method: str, path: str) -> dict[str, str] | None:
        """The view's arguments when a request for `method` and `path` is this route's."""
        if method != self.method:
            return None
        found = self.path.match(path)
        return None if found is None else found.groupdict()
