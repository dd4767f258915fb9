"""Daemon.objects.by_pk, the daemon protocol's read of its daemon, gives what the
ORM gives: every field, converted the same way."""

import pytest
from django.utils import timezone

from jobs import services
from queues.models import Daemon
from tests import builders

pytestmark = pytest.mark.django_db


def _fields(daemon: Daemon) -> dict:
    return {f.attname: getattr(daemon, f.attname) for f in Daemon._meta.concrete_fields}


def test_it_reads_what_the_orm_reads():
    provider = builders.provider(name="p")
    builders.queue(name="a")
    running = services.invocation_submit(function="lakeshore.functions.echo", queue="a")[0]
    daemon = builders.daemon(
        queues=["a", "b"],
        state="busy",
        provider=provider,
        instance_type="gpu-1",
        external_id="123",
        last_heartbeat_at=timezone.now(),
        current_invocation=running,
    )
    plain = builders.daemon(queues=[])

    for made in (daemon, plain):
        read = Daemon.objects.by_pk(made.pk)
        assert _fields(read) == _fields(Daemon.objects.get(pk=made.pk))
        assert read._state.adding is False and read._state.db == "default"
        read.save(update_fields=["state"])  # a real row the ORM can write back


@pytest.mark.parametrize("pk", [0, -1, 10**9, 2**63, -(2**63) - 1])
def test_an_unknown_or_impossible_id_is_none(pk):
    assert Daemon.objects.by_pk(pk) is None
