"""Output serializers with fields built once and a representation plan
(lakeshore_admin/output.py) answer exactly what DRF's own loop answers."""

import datetime

import pytest
from rest_framework import serializers

from fleet.api.serializers import DaemonSerializer
from fleet.models import Daemon
from jobs.api.serializers import InvocationDetailSerializer, InvocationSerializer
from jobs.models import Invocation
from tests.support import builders

pytestmark = pytest.mark.django_db


def _drf(serializer_class, instance):
    """DRF's generic loop over the same fields."""
    return serializers.Serializer.to_representation(serializer_class(), instance)


def test_invocations_render_as_drf_renders_them():
    daemon = builders.daemon()
    when = datetime.datetime(2026, 5, 4, 3, 2, 1, 123456, tzinfo=datetime.UTC)
    rows = [
        Invocation.objects.create(function="a.b"),
        Invocation.objects.create(
            function="a.b",
            queue="q",
            args=[1, "x", None],
            kwargs={"k": {"n": [1.5]}},
            priority=-3,
            state="succeeded",
            daemon=daemon,
            attempts=2,
            max_attempts=3,
            timeout_s=60,
            key="k",
            result={"ok": True},
            error="",
            started_at=when,
            finished_at=when,
        ),
    ]
    for row in Invocation.objects.filter(pk__in=[r.pk for r in rows]):
        ours = InvocationSerializer(row).data
        assert ours == _drf(InvocationSerializer, row)
        assert ours["worker"] == (None if row.daemon_id is None else str(daemon.pk))
        assert ours["id"] == str(row.pk)
    many = InvocationSerializer(Invocation.objects.order_by("id"), many=True).data
    assert [dict(r) for r in many] == [_drf(InvocationSerializer, r) for r in rows]


def test_a_detail_with_and_without_a_position_renders_as_drf_renders_it():
    row = Invocation.objects.create(function="a.b")
    row.position = {"ahead": 3, "exact": True, "capped": False}
    assert InvocationDetailSerializer(row).data == _drf(InvocationDetailSerializer, row)
    row.position = None
    assert InvocationDetailSerializer(row).data["position"] is None


def test_daemons_with_and_without_a_provider_render_as_drf_renders_them():
    provider = builders.provider(name="sim")
    builders.daemon(name="a")
    builders.daemon(name="b", provider=provider)
    for daemon in Daemon.objects.select_related("provider"):
        assert DaemonSerializer(daemon).data == _drf(DaemonSerializer, daemon)
    assert DaemonSerializer(Daemon.objects.get(name="b")).data["provider"] == "sim"
