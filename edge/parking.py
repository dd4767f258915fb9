"""A request's waits parked on the event loop: a view that long-polls (a daemon's claim
or exchange) runs its steps (jobs/waits.py) until their first wait, and where the
edge offers it (jobs/waits.PARKING) hands the rest here rather than sleep in its
thread. Its placeholder answer goes through the middleware like any other and is not
sent; the edge drives the steps on the loop (each step in a worker thread, each wait a
coroutine holding no thread), then has the view render the answer (`finish`) and sends
it with the headers the middleware gave the placeholder. Django's own answer path sets
every header; nothing here stands in for the middleware."""

from collections.abc import Callable
from dataclasses import dataclass

from django.http import HttpResponse
from django.utils.cache import patch_vary_headers

from jobs.waits import Steps, Wait


@dataclass
class Parked:
    """What a view parked: its steps where they wait, the request they serve, and how
    the view renders their end (`finish(value, error)`: a rendered response)."""

    steps: Steps
    wait: Wait
    finish: Callable[[object, BaseException | None], HttpResponse]
    request: object


class Parking:
    """The edge's offer to one request. `parked`: what its view parked, if it did;
    `headers`: those its placeholder answer got from the middleware."""

    def __init__(self):
        self.parked: Parked | None = None
        self.headers: list[tuple[bytes, bytes]] = []

    def park(self, steps: Steps, wait: Wait, finish: Callable, request) -> None:
        self.parked = Parked(steps, wait, finish, request)

    def headers_for(self, response) -> list[tuple[bytes, bytes]]:
        """The answer's headers: its own (content type, status-specific ones), and
        every header the middleware gave the placeholder that it does not set itself;
        Vary merges both."""
        middleware = {name.decode("latin1"): value.decode("latin1") for name, value in self.headers}
        if "vary" in middleware:
            patch_vary_headers(response, [v.strip() for v in middleware["vary"].split(",")])
        response["Content-Length"] = str(len(response.content))
        own = {name.lower() for name in response.headers}
        return [
            *(
                (name.encode("latin1"), value.encode("latin1"))
                for name, value in middleware.items()
                if name not in own
            ),
            *(
                (name.lower().encode("latin1"), value.encode("latin1"))
                for name, value in response.items()
            ),
        ]
