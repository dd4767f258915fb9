"""Rows made into instances by lakeshore_admin/rows.py (the claim, complete and submit
statements; Daemon.objects.by_pk) equal what the ORM makes: every field, converted the
same way (JSON, bytes, times, nulls)."""

import pytest
from django.utils import timezone

from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from lakeshore_admin.rows import model_rows
from tests.support import builders

pytestmark = pytest.mark.django_db


def _fields(row) -> dict:
    return {f.attname: getattr(row, f.attname) for f in type(row)._meta.concrete_fields}


def test_it_reads_what_the_orm_reads():
    provider = builders.provider(name="p")
    builders.queue(name="a")
    daemon = builders.daemon(
        queues=["a", "b"],
        state="busy",
        provider=provider,
        instance_type="gpu-1",
        external_id="123",
        last_heartbeat_at=timezone.now(),
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


def test_invocations_read_as_the_orm_reads_them():
    builders.queue(name="a")
    plain = services.invocation_submit(function="m.f", queue="a")[0]
    rich = services.invocation_submit(
        function="m.f", queue="a", args=[1, {"x": [None, 2.5]}], kwargs={"k": "v"}, key="k1"
    )[0]
    Invocation.objects.filter(pk=rich.pk).update(
        result={"deep": [1, "two"]},
        result_blob=b"\x00\x01",
        args_blob=b"abc",
        run_config={"env": {"A": "1"}},
        started_at=timezone.now(),
        retry_of=plain,
    )
    Invocation.objects.filter(pk=plain.pk).update(result=["a list"])

    made = model_rows(Invocation, "SELECT * FROM jobs_invocation ORDER BY id", [])

    assert [_fields(row) for row in made] == [
        _fields(row) for row in Invocation.objects.order_by("id")
    ]
    assert made[1].result == {"deep": [1, "two"]} and bytes(made[1].result_blob) == b"\x00\x01"
    assert model_rows(Invocation, "SELECT * FROM jobs_invocation WHERE false", []) == []


def test_a_column_the_model_has_not_is_an_error():
    builders.queue(name="a")
    services.invocation_submit(function="m.f", queue="a")
    with pytest.raises(ValueError, match="no field for column"):
        model_rows(Invocation, "SELECT *, 1 AS extra FROM jobs_invocation", [])
