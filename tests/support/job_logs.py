"""A job's log through the real API: a job claimed by a daemon registered with its own
credential, what the daemon ships of it, and what a viewer reads back."""

import time

from rest_framework.test import APIClient

from tests.support import builders

ECHO = "lakeshore.functions.echo"


def client(token: str) -> APIClient:
    made = APIClient()
    made.credentials(**builders.auth(token))
    return made


def registered(queue: str) -> tuple[str, APIClient]:
    """A daemon registered through the API, and a client holding its own credential."""
    answer = client(builders.token("daemon")).post(
        "/api/v1/daemons/register/", {"name": f"d-{queue}", "queues": [queue]}, format="json"
    )
    assert answer.status_code == 201, answer.content
    return answer.json()["id"], client(answer.json()["token"])


def running_job():
    """A job claimed by a registered daemon: (job id, daemon id, the daemon's client)."""
    name = builders.queue().name
    operator = client(builders.token("operator"))
    job = operator.post("/api/v1/jobs/", {"function": ECHO, "queue": name}, format="json")
    me, daemon = registered(name)
    claimed = daemon.post(f"/api/v1/daemons/{me}/claim/", {"limit": 1}, format="json").json()
    assert claimed[0]["id"] == job.json()["id"]
    return int(job.json()["id"]), me, daemon


def ship(daemon, me, job, lines, *, seq=0, attempt=1, dropped=0):
    return daemon.post(
        f"/api/v1/daemons/{me}/logs/",
        {
            "chunks": [
                {"invocation": job, "attempt": attempt, "seq": seq, "lines": lines}
                | ({"dropped": dropped} if dropped else {})
            ]
        },
        format="json",
    )


def lines(n, *, start=0, stream="o", at=None):
    at = time.time() if at is None else at
    return [[stream, at, f"line {i}"] for i in range(start, start + n)]


def read(job, **params):
    answer = client(builders.token("viewer")).get(f"/api/v1/jobs/{job}/logs/", params)
    assert answer.status_code == 200, answer.content
    return answer.json()
