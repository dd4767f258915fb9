import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.roles import grant
from jobs import services, views
from jobs.models import Invocation
from tests.support import builders

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(client):
    user = get_user_model().objects.create_user("alice", password="pw-x-12345")
    grant(user, "viewer")  # the console needs a role (tests/web/test_console_roles.py)
    client.force_login(user)
    return client


def test_it_lists_jobs_newest_first_and_filters_by_state_and_queue(alice):
    builders.queue(name="train")
    old = Invocation.objects.create(function="a.first", queue="train")
    new = Invocation.objects.create(function="a.second", state="succeeded")
    body = alice.get("/jobs/").content.decode()
    assert body.index("a.second") < body.index("a.first")
    assert 'hx-get="/jobs/" hx-target="#job-table"' in body  # the filter swaps the table
    only = alice.get("/jobs/?state=succeeded").content.decode()
    assert "a.second" in only and "a.first" not in only
    by_queue = alice.get("/jobs/?queue=train").content.decode()
    assert "a.first" in by_queue and "a.second" not in by_queue
    assert old.pk < new.pk


def test_it_pages_by_keyset(alice):
    Invocation.objects.bulk_create([Invocation(function=f"a.job{i:03d}") for i in range(60)])
    first = alice.get("/jobs/").content.decode()
    assert "a.job059" in first and "a.job009" not in first and "Older jobs" in first
    cursor = Invocation.objects.order_by("-id").values_list("id", flat=True)[49]
    second = alice.get(
        f"/jobs/?cursor={cursor}", headers={"HX-Request": "true", "HX-Target": "job-table"}
    )
    body = second.content.decode()
    assert body.lstrip().startswith('<div id="job-table"')
    assert "a.job009" in body and "a.job010" not in body and "Older jobs" not in body


def test_a_bad_filter_says_so(alice):
    body = alice.get("/jobs/?state=done").content.decode()
    assert 'role="alert"' in body and "state" in body


def test_it_costs_the_same_queries_for_1_and_50_jobs(alice):
    def count():
        with CaptureQueriesContext(connection) as ctx:
            assert alice.get("/jobs/").status_code == 200
        return len(ctx)

    Invocation.objects.create(function="a.b")
    one = count()
    daemon = builders.daemon()
    Invocation.objects.bulk_create(
        [Invocation(function="a.b", daemon=daemon, state="running") for _ in range(49)]
    )
    assert count() == one


@pytest.mark.parametrize("query", ["cursor=100000000000000000000000", "cursor=1.5", "worker=1e30"])
def test_an_out_of_range_id_is_an_error_not_a_crash(alice, query):
    response = alice.get(f"/jobs/?{query}")
    assert response.status_code == 200
    assert 'role="alert"' in response.content.decode()


def test_an_sdk_invocation_shows_its_function_and_priority_as_people_read_them(alice):
    Invocation.objects.create(
        function="hello_udfs.add", wire="envelope", args_blob=b"\x00" * 99, priority=5.5
    )
    Invocation.objects.create(function="a.whole", priority=5)
    body = alice.get("/jobs/").content.decode()
    assert "hello_udfs.add" in body
    assert (
        '<td data-label="Priority">5.5</td>' in body
        and '<td data-label="Priority">5</td>' in body
        and '<td data-label="Priority">5.0</td>' not in body
    )


def _operator(client):
    user = get_user_model().objects.create_user("olga", password="pw-x-12345")
    grant(user, "operator")
    client.force_login(user)
    return client


def test_it_filters_by_function_prefix_id_and_time(alice):
    a = Invocation.objects.create(function="train.step")
    b = Invocation.objects.create(function="eval.run")
    Invocation.objects.filter(pk=b.pk).update(created_at=timezone.now() - timedelta(days=3))
    by_prefix = alice.get("/jobs/?function=train.").content.decode()
    assert "train.step" in by_prefix and "eval.run" not in by_prefix
    by_id = alice.get(f"/jobs/?id={b.pk}").content.decode()
    assert "eval.run" in by_id and "train.step" not in by_id
    since = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    recent = alice.get(f"/jobs/?since={since}").content.decode()
    assert "train.step" in recent and "eval.run" not in recent
    assert 'role="alert"' in alice.get("/jobs/?since=soon").content.decode()
    assert a.pk != b.pk


def test_it_pages_both_ways_and_keeps_the_filter(alice):
    Invocation.objects.bulk_create([Invocation(function=f"a.job{i:03d}") for i in range(120)])
    Invocation.objects.create(function="other.x")
    first = alice.get("/jobs/?function=a.").content.decode()
    older = re.search(r'href="(/jobs/\?[^"]*after=\d+[^"]*)"[^>]*>Older', first).group(1)
    assert "function=a." in older and "← Newer" not in first
    second = alice.get(older.replace("&amp;", "&")).content.decode()
    assert "a.job069" in second and "a.job070" not in second and "a.job020" in second
    newer = re.search(r'href="(/jobs/\?[^"]*before=\d+[^"]*)"[^>]*>← Newer', second).group(1)
    back = alice.get(newer.replace("&amp;", "&")).content.decode()
    assert "a.job119" in back and "a.job070" in back and "a.job069" not in back
    assert "other.x" not in back  # the filter held


def test_an_operator_cancels_the_queued_of_the_filtered_queue_after_a_count(client):
    operator = _operator(client)
    builders.queue(name="train")
    for _ in range(3):
        services.invocation_submit(function="a.b", queue="train")
    other, _ = services.invocation_submit(function="a.b")
    page = operator.get("/jobs/?queue=train").content.decode()
    assert "Cancel 3 queued in train" in page
    assert 'hx-confirm="Cancel 3 queued invocation(s) of queue train?' in page
    body = operator.post("/jobs/bulk-cancel/", {"queue": "train"}, follow=True).content.decode()
    assert "Cancelled 3 queued invocation(s) of queue train." in body
    assert Invocation.objects.filter(queue="train", state="killed").count() == 3
    other.refresh_from_db()
    assert other.state == "queued"  # only the filtered queue
    assert "Cancel 3 queued" not in operator.get("/jobs/").content.decode()  # no queue filter


def test_the_bulk_cancel_count_is_bounded_on_a_big_backlog(client, monkeypatch):
    monkeypatch.setattr(views, "CANCEL_COUNT_CAP", 5)
    operator = _operator(client)
    builders.queue(name="train")
    Invocation.objects.bulk_create([Invocation(queue="train", function="a.b") for _ in range(8)])
    page = operator.get("/jobs/?queue=train").content.decode()
    assert "Cancel 5+ queued in train" in page
    body = operator.post("/jobs/bulk-cancel/", {"queue": "train"}, follow=True).content.decode()
    assert "Cancelled 8 queued invocation(s) of queue train." in body  # all of them


def _failed(error: str, queue: str = "train") -> Invocation:
    row = Invocation.objects.create(queue=queue, function="train.step", state="failed", error=error)
    Invocation.objects.filter(pk=row.pk).update(finished_at=row.created_at)
    return row


def test_the_list_searches_the_function_the_key_and_the_error(client):
    alice = _operator(client)
    builders.queue(name="train")
    _failed("OSError: disk full")
    _failed("KeyError: 'label'")
    page = alice.get("/jobs/?search=DISK").content.decode()
    assert 'name="search"' in page and 'value="DISK"' in page
    assert "OSError: disk full" in page and "KeyError" not in page
    short = alice.get("/jobs/?search=ab").content.decode()
    assert "Ensure this value has at least 3 characters" in short


def test_an_operator_retries_the_failed_the_list_shows_after_a_count(client):
    alice = _operator(client)
    builders.queue(name="train")
    disk = [_failed("OSError: disk full") for _ in range(2)]
    _failed("KeyError: 'label'")
    page = alice.get("/jobs/?state=failed&queue=train&search=disk").content.decode()
    assert "Retry 2 shown (state failed; queue train; search &#x27;disk&#x27;)" in page
    assert 'hx-confirm="Retry 2 job(s) (state failed; queue train; search' in page
    body = alice.post(
        "/jobs/bulk-retry/",
        {"state": ["failed"], "queue": "train", "search": "disk"},
        follow=True,
    ).content.decode()
    assert "Retried 2 job(s): state failed; queue train; search &#x27;disk&#x27;." in body
    assert sorted(Invocation.objects.exclude(retry_of=None).values_list("retry_of", flat=True)) == [
        r.pk for r in disk
    ]
    # a list whose filters a bulk retry does not take offers none
    assert "bulk-retry" not in alice.get("/jobs/?state=failed&function=train").content.decode()
    assert "bulk-retry" not in alice.get("/jobs/?state=succeeded").content.decode()


def test_a_viewer_is_offered_no_bulk_retry(client):
    builders.queue(name="train")
    _failed("OSError: disk full")
    user = get_user_model().objects.create_user("vera", password="pw-x-12345")
    grant(user, "viewer")
    client.force_login(user)
    viewer = client
    assert "Retry 1 shown" not in viewer.get("/jobs/?state=failed").content.decode()
    assert "bulk-retry" not in viewer.get("/jobs/?state=failed").content.decode()
