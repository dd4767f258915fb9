"""GET /metrics's counters and histograms as rows of the database (MetricTotal): what a
process counted reaches the table at a flush and adds to it, a scrape shows every
process's rows, a failed flush loses nothing, and the names, types and help are the
README's."""

from pathlib import Path

import pytest
from django.db import ProgrammingError, connection, transaction
from django.test.utils import CaptureQueriesContext

from fleet import protocol
from jobs import services
from jobs.transitions import kill
from lakeshore_admin import metrics
from queues.models import MetricTotal
from tests.ops.test_metrics import (
    ACTIONS,
    ECHO,
    ENDED,
    RUN_SECONDS,
    RUNS,
    scrape,
    value,
)
from tests.support import builders

pytestmark = pytest.mark.django_db


@pytest.mark.django_db(transaction=True)
def test_counts_reach_the_database_at_a_flush_and_add_up(viewer):
    """Real commits: what this process counted is in its memory until a flush (here a
    scrape: the tests' settings run no flush thread), then in the table, added to what
    was there."""
    builders.queue(name="f")
    queued = [services.invocation_submit(function=ECHO, queue="f")[0] for _ in range(2)]
    labels = {"queue": "f", "state": "killed"}

    assert kill.kill_queued(invocation_id=queued[0].pk, reason="one")
    assert not MetricTotal.objects.exists()  # counted, not written
    assert value(scrape(viewer), ENDED, **labels) == 1
    assert MetricTotal.objects.get(name=ENDED, labels=labels).value == 1
    assert kill.kill_queued(invocation_id=queued[1].pk, reason="two")
    assert value(scrape(viewer), ENDED, **labels) == 2
    assert MetricTotal.objects.get(name=ENDED, labels=labels).value == 2
    assert metrics.flush() == 0  # nothing left to write


def test_a_scrape_shows_what_other_processes_wrote(viewer):
    """Rows another process added (another web host, the Celery worker) are in every
    scrape; a histogram's rows (each bucket alone) are shown cumulative, with their
    count. A row of no known metric is not shown."""
    rows = [
        (ENDED, {"queue": "x", "state": "failed"}, 5),
        (ACTIONS, {"queue": "x", "action": "scale_up"}, 2),
        ("lakeshore_invocation_run_seconds_bucket", {"queue": "x", "le": "0.1"}, 3),
        ("lakeshore_invocation_run_seconds_bucket", {"queue": "x", "le": "60.0"}, 1),
        ("lakeshore_invocation_run_seconds_bucket", {"queue": "x", "le": "+Inf"}, 1),
        (RUN_SECONDS, {"queue": "x"}, 90000.2),
        ("lakeshore_retired_total", {"queue": "x"}, 7),
    ]
    MetricTotal.objects.bulk_create(
        MetricTotal(name=name, labels=labels, value=n) for name, labels, n in rows
    )

    samples = scrape(viewer)

    assert value(samples, ENDED, queue="x", state="failed") == 5
    assert value(samples, ACTIONS, queue="x", action="scale_up") == 2
    buckets = {
        dict(labels)["le"]: n
        for (name, *labels), n in samples.items()
        if name == "lakeshore_invocation_run_seconds_bucket"
    }
    assert list(buckets) == [*metrics.BOUNDS]
    assert (buckets["0.05"], buckets["0.1"], buckets["15.0"], buckets["60.0"]) == (0, 3, 3, 4)
    assert buckets["86400.0"] == 4 and buckets["+Inf"] == 5
    assert value(samples, RUNS, queue="x") == 5
    assert value(samples, RUN_SECONDS, queue="x") == 90000.2
    assert not [key for key in samples if key[0].startswith("lakeshore_retired")]


def test_a_failed_flush_keeps_the_counts_for_the_next(viewer, django_capture_on_commit_callbacks):
    builders.queue(name="k")
    inv, _ = services.invocation_submit(function=ECHO, queue="k")
    with django_capture_on_commit_callbacks(execute=True):
        assert kill.kill_queued(invocation_id=inv.pk, reason="counted")
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {metrics.TABLE} RENAME TO metrics_away")
    with pytest.raises(ProgrammingError), transaction.atomic():
        metrics.flush()
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE metrics_away RENAME TO {metrics.TABLE}")

    assert value(scrape(viewer), ENDED, queue="k", state="killed") == 1


def test_the_scrape_names_and_types_are_the_readmes(viewer, django_capture_on_commit_callbacks):
    """Every counter and histogram the README's table lists, with its type, labels and
    help: what the alerts and dashboards rely on."""
    builders.queue(name="n")
    inv, _ = services.invocation_submit(function=ECHO, queue="n")
    daemon = builders.daemon(queues=["n"])
    with django_capture_on_commit_callbacks(execute=True):
        builders.claim(daemon=daemon)
        protocol.invocation_complete(daemon=daemon, invocation_id=inv.pk, attempt=1)
    text = viewer.get("/metrics").content.decode()
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for family in metrics.FAMILIES:
        shown = f"{family.name}_total" if family.kind == "counter" else family.name
        assert f"# HELP {shown} {family.help}\n# TYPE {shown} {family.kind}\n" in text
        labels = ", ".join(f"`{label}`" for label in family.labels)
        assert f"| `{shown}` | {family.kind} | {labels} |" in readme, shown


@pytest.mark.django_db(transaction=True)
def test_a_claim_and_its_completion_add_no_statement(viewer):
    """The hot path: counting costs a claim and a completion nothing in the database
    (committed for real, so the counts are kept); the counts are written by a later
    flush, here the scrape's, in one statement of its own."""
    builders.queue(name="hot")
    inv, _ = services.invocation_submit(function=ECHO, queue="hot")
    daemon = builders.daemon(queues=["hot"])

    with CaptureQueriesContext(connection) as work:
        assert builders.claim(daemon=daemon)
        protocol.invocation_complete(daemon=daemon, invocation_id=inv.pk, attempt=1)
    with CaptureQueriesContext(connection) as scraped:
        samples = scrape(viewer)

    assert not [q for q in work.captured_queries if metrics.TABLE in q["sql"]]
    writes = [q for q in scraped.captured_queries if q["sql"].lstrip().startswith("INSERT")]
    assert len(writes) == 1 and metrics.TABLE in writes[0]["sql"]  # the control
    assert value(samples, ENDED, queue="hot", state="succeeded") == 1
    assert value(samples, RUNS, queue="hot") == 1
