"""Scale from zero without waiting for a tick (issue 20), end to end: gunicorn and a Celery
worker with beat as `make run` starts them (the beat's tick an hour away), the `local`
provider starting real `lakeshore daemon run` processes. A submit over HTTP into an
elastic queue with no daemon launches the first one at once, not at the tick an hour
away, and the event says the submit woke the controller. How soon (under a second, as
issue 20 asks) is printed: a figure, not a bound. The negative controls: a queue with a
live daemon and a queue with no provider send no wake."""

import time

import httpx
import pytest

from fleet.models import Daemon
from jobs.models import Invocation
from queues.models import QueueEvent
from tests.support import builders, stack
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ECHO = "lakeshore.functions.echo"


def _submit(base: str, token: str, queue: str) -> dict:
    response = httpx.post(
        f"{base}/api/v1/jobs/",
        json={"function": ECHO, "queue": queue, "args": [queue]},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    return response.json()


@pytest.mark.parametrize("broker", stack.BROKERS)
def test_a_submit_launches_the_first_daemon_without_waiting_for_the_tick(tmp_path, broker):
    builders.provider(name="here", kind="local", config={"concurrency": 1})
    builders.queue(
        name="elastic",
        provider="here",
        elasticity_spec={"kind": "fully_elastic", "min": 0, "max": 2},
    )
    builders.queue(name="served", provider="here", elasticity_spec={"kind": "fully_elastic"})
    builders.daemon(queues=["served"], state="busy")  # live: no wake
    builders.queue(name="plain")  # no provider: no wake
    token = builders.token("operator")

    with stack.running(tmp_path, broker=broker) as (base, worker_log):
        for queue in ("served", "plain"):
            assert _submit(base, token, queue)["state"] == "queued"
        started = time.monotonic()
        job = _submit(base, token, "elastic")
        wait_for(  # the beat's tick is an hour away
            lambda: Daemon.objects.filter(queues=["elastic"]).exists(),
            timeout=30,
            what="the first daemon's launch",
        )
        took = time.monotonic() - started
        wait_for(
            lambda: Invocation.objects.get(pk=job["id"]).state == "succeeded",
            timeout=60,
            what="the job on the daemon the wake started",
        )
        events = httpx.get(
            f"{base}/api/v1/queues/elastic/events/?verbose=1",
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        log = worker_log.read_text()

    assert [e["action"] for e in events] == ["scale_up"]
    assert events[0]["reason"].startswith("woken by a submit: ") and events[0]["delta"] == 1
    # the negative controls: no wake sent, no decision made, for either queue
    assert log.count("Task fleet.wake[") == 2, log  # one wake: received, then succeeded
    assert not QueueEvent.objects.filter(queue__name__in=["served", "plain"]).exists()
    print(f"\nsubmit → launch with {broker.split(':')[0]}: {took * 1000:.0f} ms")
