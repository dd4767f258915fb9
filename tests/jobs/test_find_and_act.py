"""Find and act in bulk: `?search=` over the function, the key and the error's headline
(through its trigram index), and bulk retry and bulk cancel by state, queue, search and
time, in batches, with an audit event naming the filter."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import AuditEvent
from jobs import services
from jobs.models import Invocation
from lakeshore_admin import hooks
from tests.jobs.test_invocation_indexes import _plan
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

DISK = "Traceback (most recent call last):\n  File x\nOSError: disk full on /scratch\n"


def ended(state="failed", *, queue="train", function="train.step", error="", key="", ago_s=60):
    row = Invocation.objects.create(
        queue=queue, function=function, state=state, error=error, key=key
    )
    Invocation.objects.filter(pk=row.pk).update(
        finished_at=timezone.now() - timedelta(seconds=ago_s)
    )
    return row


def ids(response) -> list[int]:
    assert response.status_code == 200, response.json()
    return [int(j["id"]) for j in response.json()]


# ---------------------------------------------------------------------------- search


def test_search_finds_the_function_the_key_and_the_error_in_any_case(viewer):
    builders.queue(name="train")
    by_error = ended(error=DISK)
    by_key = ended("succeeded", key="DISK-check-7")
    by_function = ended("succeeded", function="tools.disks.scan")
    ended("failed", error="KeyError: 'label'")
    assert ids(viewer.get("/api/v1/jobs/?search=disk")) == [by_function.pk, by_key.pk, by_error.pk]
    assert ids(viewer.get("/api/v1/jobs/?search=Disk&state=failed")) == [by_error.pk]
    assert ids(viewer.get("/api/v1/jobs/?search=50%25")) == []  # % is a character, not a wildcard


def test_search_reads_its_index():
    ended(error=DISK)
    assert "inv_search" in _plan(Invocation.objects.matching("disk full").order_by())


@pytest.mark.parametrize("text", ["ab", "x" * 201])
def test_a_search_too_short_or_too_long_is_refused(viewer, text):
    assert_error(viewer.get(f"/api/v1/jobs/?search={text}"), 400, "invalid", field="search")


# ---------------------------------------------------------------------------- retry


def test_bulk_retry_retries_every_match_once_and_names_the_filter(operator):
    builders.queue(name="train")
    builders.queue(name="eval")
    disk = [ended(error=DISK) for _ in range(3)]
    ended(error="KeyError: 'label'")
    ended("failed", queue="eval", error=DISK)
    ended("succeeded")
    old = ended(error=DISK, ago_s=3 * 3600)
    body = {"state": ["failed"], "queue": "train", "search": "disk", "since": "1h"}

    dry = operator.post("/api/v1/jobs/bulk-retry/", {**body, "dry_run": True}, format="json")
    assert dry.json() == {
        "matched": 3,
        "retried": 0,
        "dry_run": True,
        "filter": "state failed; queue train; search 'disk'; since 1h",
    }
    assert not Invocation.objects.filter(retry_of__isnull=False).exists()

    done = operator.post("/api/v1/jobs/bulk-retry/", body, format="json").json()
    assert done["retried"] == 3
    retries = Invocation.objects.filter(retry_of__isnull=False)
    assert sorted(r.retry_of_id for r in retries) == [r.pk for r in disk]
    assert {(r.state, r.queue, r.function) for r in retries} == {("queued", "train", "train.step")}
    assert not Invocation.objects.filter(retry_of=old).exists()
    event = AuditEvent.objects.get(action="jobs.bulk_retry")
    assert event.summary == "retried 3: state failed; queue train; search 'disk'; since 1h"
    assert event.actor.startswith("operator-")  # who asked, not "system"

    again = operator.post("/api/v1/jobs/bulk-retry/", body, format="json").json()
    assert again["retried"] == 0  # each once: a retried job is not retried again
    assert Invocation.objects.filter(retry_of__isnull=False).count() == 3


def test_bulk_retry_goes_in_batches_and_keeps_the_sdk_blob(monkeypatch):
    monkeypatch.setattr(services, "RETRY_BATCH", 2)
    builders.queue(name="train")
    rows = [ended("timeout") for _ in range(5)]
    Invocation.objects.filter(pk=rows[0].pk).update(
        wire="envelope", args_blob=b"\x93\x01", run_config={"gpu": 1}
    )
    with CaptureQueriesContext(connection) as ctx:
        answer = services.invocation_bulk_retry(states=["timeout"])
    assert answer["retried"] == 5
    inserts = [
        q for q in ctx.captured_queries if q["sql"].startswith("\nINSERT INTO jobs_invocation")
    ]
    assert len(inserts) == 3  # 2 + 2 + 1
    sdk = Invocation.objects.get(retry_of=rows[0])
    assert (sdk.wire, bytes(sdk.args_blob), sdk.run_config) == ("envelope", b"\x93\x01", {"gpu": 1})


def test_a_full_queue_stops_the_retry_and_says_how_many_went(monkeypatch):
    monkeypatch.setattr(services, "RETRY_BATCH", 2)
    builders.queue(name="train", max_depth=3)
    for _ in range(5):
        ended()
    with pytest.raises(services.BacklogFull) as refused:
        services.invocation_bulk_retry(states=["failed"])
    assert refused.value.extra["retried"] == 2
    assert "Retried 2 before it stopped." in refused.value.message
    assert Invocation.objects.filter(state="queued").count() == 2
    assert AuditEvent.objects.get(action="jobs.bulk_retry").summary == "retried 2: state failed"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"state": ["succeeded"]}, "state.0"),
        ({"state": []}, "state"),
        ({}, "state"),
        ({"state": ["failed"], "since": "yesterday"}, "since"),
        ({"state": ["failed"], "search": "ab"}, "search"),
        ({"state": ["failed"], "colour": "red"}, "colour"),
    ],
)
def test_bulk_retry_refuses_what_it_cannot_read(operator, body, field):
    assert_error(
        operator.post("/api/v1/jobs/bulk-retry/", body, format="json"), 400, "invalid", field=field
    )


def test_bulk_retry_of_an_unknown_queue_is_not_found(operator):
    response = operator.post(
        "/api/v1/jobs/bulk-retry/", {"state": ["failed"], "queue": "nope"}, format="json"
    )
    assert_error(response, 404, "not_found", field="queue")


def test_a_viewer_may_not_retry_in_bulk(viewer):
    ended()
    response = viewer.post("/api/v1/jobs/bulk-retry/", {"state": ["failed"]}, format="json")
    assert response.status_code == 403
    assert not Invocation.objects.filter(retry_of__isnull=False).exists()


@pytest.mark.django_db(transaction=True)
def test_a_bulk_retry_that_comes_while_another_is_inserting_retries_none_twice():
    """The second arrives after the first locked its batch and before it inserted: its
    read of the matches (which says "not retried yet") waits for the first one's locks,
    then it looks again for retries of what it locked, finds them, and skips those."""
    builders.queue(name="train")
    for _ in range(4):
        ended()
    answers = {}

    def bulk_retry(name):
        try:
            answers[name] = services.invocation_bulk_retry(states=["failed"])["retried"]
        except Exception as exc:  # noqa: BLE001 - asserted below
            answers[name] = repr(exc)
        finally:
            connection.close()

    second = threading.Thread(target=bulk_retry, args=("second",))

    def let_the_second_in():
        hooks.clear("bulk_retry.before_insert")  # the second passes this point freely
        second.start()
        second.join(1.0)  # it waits on our locks

    hooks.register("bulk_retry.before_insert", let_the_second_in)
    try:
        bulk_retry("first")
    finally:
        hooks.clear("bulk_retry.before_insert")
    second.join(10)
    assert answers == {"first": 4, "second": 0}
    retried = list(Invocation.objects.exclude(retry_of=None).values_list("retry_of", flat=True))
    assert len(retried) == len(set(retried)) == 4


# ---------------------------------------------------------------------------- cancel


def test_bulk_cancel_takes_a_search_and_a_time(operator):
    builders.queue(name="train")
    keep = services.invocation_submit(function="train.step", queue="train")[0]
    hit = services.invocation_submit(function="train.dataprep", queue="train")[0]
    stale = services.invocation_submit(function="train.dataprep", queue="train")[0]
    Invocation.objects.filter(pk=stale.pk).update(created_at=timezone.now() - timedelta(days=2))
    body = {"queue": "train", "search": "dataprep", "since": "1d"}
    dry = operator.post("/api/v1/jobs/bulk-cancel/", {**body, "dry_run": True}, format="json")
    assert dry.json()["cancelled"] == 1
    done = operator.post("/api/v1/jobs/bulk-cancel/", body, format="json")
    assert done.json()["cancelled"] == 1
    states = dict(Invocation.objects.values_list("id", "state"))
    assert (states[keep.pk], states[hit.pk], states[stale.pk]) == ("queued", "killed", "queued")
    event = AuditEvent.objects.get(action="jobs.bulk_cancel")
    assert event.target == "queue train; search 'dataprep'; since 1d"


def test_a_state_filter_reads_without_distinct(viewer):
    ended(error=DISK)
    with CaptureQueriesContext(connection) as ctx:
        assert len(ids(viewer.get("/api/v1/jobs/?state=failed&state=timeout"))) == 1
    listed = [q["sql"] for q in ctx.captured_queries if 'FROM "jobs_invocation"' in q["sql"]]
    assert listed and not any("DISTINCT" in sql for sql in listed)


@pytest.mark.parametrize("since", ["999999d", "2026-13-01T00:00:00"])
def test_a_since_that_is_no_moment_is_refused(operator, since):
    body = {"state": ["failed"], "since": since}
    response = operator.post("/api/v1/jobs/bulk-retry/", body, format="json")
    assert_error(response, 400, "invalid", field="since")
