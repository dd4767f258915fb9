"""Bulk-cancel works in batches, each its own transaction, so it never holds one lock
over the whole backlog."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import protocol
from jobs import services
from jobs.models import Invocation
from jobs.transitions import kill
from tests import builders

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_cancels_everything_queued_in_batches():
    builders.queue(name="w")
    for _ in range(5):
        services.invocation_submit(function="lakeshore.functions.echo", queue="w")
    with CaptureQueriesContext(connection) as ctx:
        cancelled = kill.kill_queued_in_batches(queue="w", reason="bulk", batch=2)
    updates = [q for q in ctx.captured_queries if q["sql"].lstrip().startswith("UPDATE")]
    commits = [q for q in ctx.captured_queries if "COMMIT" in q["sql"].upper()]
    assert cancelled == 5
    assert len(updates) == 3  # 2 + 2 + 1
    assert len(commits) == 3  # each batch committed on its own
    assert set(Invocation.objects.values_list("state", flat=True)) == {"killed"}


def test_it_leaves_running_and_other_queues_alone():
    builders.queue(name="w")
    builders.queue(name="other")
    running, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="w")
    protocol.invocation_claim(daemon=builders.daemon(queues=["w"]))
    queued, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="w")
    elsewhere, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="other")
    assert services.invocation_bulk_cancel(queue="w") == 1
    states = dict(Invocation.objects.values_list("id", "state"))
    assert states == {running.pk: "running", queued.pk: "killed", elsewhere.pk: "queued"}
