"""Provider drivers: how a provider kind launches and terminates daemons.

`simulated` records daemons without running anything (they come up after the config's
`startup_seconds`, default 0, and the provider keeps them heartbeating); its config may
say `{"fail": "message"}` to make every launch fail with that message. `local` daemons
are started by hand on a machine (`lakeshore daemon run`) for now: its launches fail
with a message that says so, which the controller records and backs off from."""

import uuid
from datetime import timedelta

from queues.models import Daemon, DaemonState, Provider, Queue


class ProviderError(Exception):
    """The provider refused or failed; the message is the provider's own."""


class Driver:
    def launch(self, *, provider: Provider, queue: Queue, count: int, now) -> list[Daemon]:
        raise NotImplementedError

    def terminate(self, *, daemon: Daemon) -> None:
        from jobs.services import daemon_drop

        daemon_drop(daemon=daemon)

    def sync(self, *, provider: Provider, queue: Queue, now) -> None:
        """Bring the records up to date with the provider before a tick looks at them."""


class SimulatedDriver(Driver):
    def launch(self, *, provider, queue, count, now):
        failure = (provider.config or {}).get("fail")
        if failure:
            raise ProviderError(str(failure))
        return Daemon.objects.bulk_create(
            [
                Daemon(
                    name=f"{queue.name}-sim-{uuid.uuid4().hex[:8]}",
                    queues=[queue.name],
                    state=DaemonState.PROVISIONING,
                    provider=provider,
                    instance_type=queue.instance_type,
                    external_id=f"sim-{uuid.uuid4()}",
                    last_heartbeat_at=now,
                )
                for _ in range(count)
            ]
        )

    def sync(self, *, provider, queue, now):
        mine = Daemon.objects.live().filter(provider=provider).subscribed_to(queue.name)
        startup = float((provider.config or {}).get("startup_seconds", 0) or 0)
        mine.filter(
            state=DaemonState.PROVISIONING, created_at__lte=now - timedelta(seconds=startup)
        ).update(state=DaemonState.IDLE, updated_at=now)
        mine.update(last_heartbeat_at=now)  # simulated daemons heartbeat through it


class LocalDriver(Driver):
    def launch(self, *, provider, queue, count, now):
        raise ProviderError(
            f"the local provider does not start daemons by itself yet: run "
            f"'lakeshore daemon run --queues {queue.name}' on a machine"
        )


DRIVERS: dict[str, Driver] = {
    Provider.Kind.SIMULATED: SimulatedDriver(),
    Provider.Kind.LOCAL: LocalDriver(),
}


def driver_for(provider: Provider) -> Driver:
    return DRIVERS[provider.kind]
