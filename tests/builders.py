"""Small builders for tests: real rows through the real services."""

import itertools

from accounts.services import token_create
from fleet import services as fleet_services
from fleet.models import Daemon, DaemonState
from queues import services

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
    from accounts.models import Role
    from accounts.services import credential_issue, service_user

    token, raw = credential_issue(
        user=service_user(username, Role.DAEMON), name=daemon.name, queues=daemon.queues
    )
    Daemon.objects.filter(pk=daemon.pk).update(token=token)
    daemon.token = token
    return token, raw
