"""A stand-in for the API at the HTTP boundary (httpx.MockTransport), and sample bodies."""

import json

import httpx
from click.testing import CliRunner

from lakeshore.cli import cli
from lakeshore.context import State


class FakeApi:
    """Answers the CLI's requests from canned responses and records what it was sent.

    `on("GET", "queues/", [...])` answers GET /api/v1/queues/; a list of responses is
    served in order (the last one repeats), for pagination and polling.
    """

    def __init__(self):
        self.routes: dict[tuple[str, str], list[httpx.Response]] = {}
        self.requests: list[httpx.Request] = []

    def on(self, method: str, path: str, *responses, status: int = 200, json=None, headers=None):
        if not responses:
            responses = (httpx.Response(status, json=json, headers=headers),)
        self.routes[(method, "/api/v1/" + path)] = list(responses)
        return self

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        responses = self.routes.get((request.method, request.url.path))
        if not responses:
            return httpx.Response(
                404, json={"error": {"code": "not_found", "message": "Not found."}}
            )
        return responses.pop(0) if len(responses) > 1 else responses[0]

    @property
    def last(self) -> httpx.Request:
        return self.requests[-1]

    def body(self, request: httpx.Request | None = None):
        return json.loads((request or self.last).content)

    def run(self, *args: str, input: str | None = None):
        state = State(transport=httpx.MockTransport(self.handle))
        return CliRunner().invoke(cli, list(args), obj=state, input=input)


def queue_json(name="training-h100", **overrides) -> dict:
    queue = {
        "name": name,
        "kind": "fifo",
        "description": "",
        "state": "active",
        "provider": None,
        "members": 0,
        "elasticity": None,
        "instance_type": "",
        "image_id": "",
        "runner": "",
        "max_depth": None,
        "on_full": "reject",
        "temperature": 1.0,
        "created_at": "2026-01-02T03:04:05.123456Z",
        "updated_at": "2026-01-02T03:04:05.123456Z",
    }
    return {**queue, **overrides}
