"""Small builders for tests: real rows through the real services."""

import asyncio
import itertools
import threading

from django.utils import timezone

from accounts.models import Role
from accounts.services import credential_issue, service_user, token_create
from fleet import controller, orders, protocol
from fleet import services as fleet_services
from fleet.models import Daemon, DaemonState
from jobs import services as jobs
from jobs import waits
from jobs.models import Invocation, InvocationState
from queues import services
from queues.models import Queue, QueueEvent

_seq = itertools.count(1)


def token(role: str = "operator", username: str | None = None) -> str:
    _, raw = token_create(username=username or f"{role}-{next(_seq)}", role=role)
    return raw


def auth(raw: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def queue(name: str | None = None, **fields):
    return services.queue_create(name=name or f"q-{next(_seq)}", **fields)


def provider(name: str | None = None, kind: str = "simulated", **fields):
    return fleet_services.provider_create(name=name or f"p-{next(_seq)}", kind=kind, **fields)


def daemon(queues: list[str] | None = None, state: str = DaemonState.IDLE, **fields) -> Daemon:
    fields.setdefault("name", f"d-{next(_seq)}")
    return Daemon.objects.create(queues=queues or [], state=state, **fields)


def claim(*, daemon: Daemon, limit: int = 1, wait: float = 0.0, rng=None, wires=None) -> list:
    """The daemon's claim (fleet/protocol.claim_steps), driven in this thread as the
    WSGI door drives it (waits.drive): what it claimed."""
    steps = protocol.claim_steps(daemon=daemon, limit=limit, wait=wait, rng=rng, wires=wires)
    return waits.drive(steps)


def exchange(
    *, daemon: Daemon, outcomes: list[dict], limit: int, wait: float = 0.0, wires=None
) -> dict:
    """The daemon's exchange (fleet/protocol.exchange_steps), driven in this thread."""
    return waits.drive(
        protocol.exchange_steps(
            daemon=daemon, outcomes=outcomes, limit=limit, wait=wait, wires=wires
        )
    )


def tick_queue(queue_id: int, *, now=None) -> QueueEvent | None:
    """The controller's decision for one queue, through the one path the beat and a
    submit's wake take (fleet/controller.decide): its event, or None when another tick
    holds the queue."""
    queue = Queue.objects.select_related("provider").get(pk=queue_id)
    return controller.decide([queue], now=now or timezone.now()).of(queue_id)


def invocation(
    state: str = InvocationState.QUEUED, *, max_attempts: int = 1, timeout_s: int | None = None
) -> Invocation:
    """An invocation in `state`, brought there by the real services: submitted (key "k")
    into a new queue, claimed by a new daemon, then reported by it or, for killed,
    stopped on it (so every ended one holds a daemon and an attempt)."""
    name = queue().name
    inv, _ = jobs.invocation_submit(
        function="x.y", queue=name, key="k", max_attempts=max_attempts, timeout_s=timeout_s
    )
    if state != InvocationState.QUEUED:
        runner = daemon(queues=[name], last_heartbeat_at=timezone.now())
        (inv,) = claim(daemon=runner)
        if state == InvocationState.KILLED:
            orders.daemon_exec(daemon=runner, verb="kill", invocation_id=inv.pk)
        elif state != InvocationState.RUNNING:
            protocol.invocation_complete(
                daemon=runner, invocation_id=inv.pk, attempt=1, outcome=state, retry=False
            )
    inv = Invocation.objects.select_related("daemon").get(pk=inv.pk)
    assert inv.state == state, (inv.state, state)
    return inv


def register(client, body: dict):
    """Register a daemon through the API with the client's token, then switch the
    client to the daemon's own credential (as `lakeshore daemon run` does): the
    answer."""
    response = client.post("/api/v1/daemons/register/", body, format="json")
    if response.status_code == 201 and response.json().get("token"):
        client.credentials(**auth(response.json()["token"]))
    return response


def credential(daemon: Daemon, username: str = "provider-sim"):
    """A daemon's own credential (as a provider mints one): (token, raw)."""
    token, raw = credential_issue(
        user=service_user(username, Role.DAEMON), name=daemon.name, queues=daemon.queues
    )
    Daemon.objects.filter(pk=daemon.pk).update(token=token)
    daemon.token = token
    return token, raw


def run_async(coroutine):
    """asyncio.run in a thread of its own: a test process may already run an event loop
    in its main thread (Playwright's sync API, after a browser test in the same worker)."""
    answer = {}

    def run():
        try:
            answer["value"] = asyncio.run(coroutine)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller
            answer["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in answer:
        raise answer["error"]
    return answer["value"]
