"""A search's cost follows its matches, not the table (jobs/search.py): a search whose
matches all lie in the oldest rows is read through its trigram index rather than by
walking every newer row; its pages, the API's and the console's, are the matches newest
first across the edge of the recent rows; a bulk action's walk starts at its oldest
match; and a search too broad to read within LAKESHORE_SEARCH_TIMEOUT_SECONDS is refused
with search_too_broad, which says how to narrow it, wherever it is typed."""

import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.roles import grant
from jobs import search, services
from jobs.models import Invocation
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

SCANS = {"Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan"}


@pytest.fixture
def ops_client(client):
    """An operator's console session."""
    user = get_user_model().objects.create_user("olga", password="pw-x-12345")
    grant(user, "operator")
    client.force_login(user)
    return client


def fill(count: int, *, retired: int = 0, every: int = 0, queue: str = "train") -> list[int]:
    """`count` finished rows, oldest first (one statement: a test's table of tens of
    thousands), and their ids: the oldest `retired` ran ledger.legacy_sync, and (if
    `every`) each `every`-th ran train.dataprep; the rest train.step."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO jobs_invocation (queue, function, args, kwargs, priority, state,
                   attempts, max_attempts, timeout_s, key, reason, error, created_at,
                   started_at, finished_at)
            SELECT %(queue)s,
                   CASE WHEN n < %(retired)s THEN 'ledger.legacy_sync'
                        WHEN %(every)s > 0 AND n %% GREATEST(%(every)s, 1) = 0
                          THEN 'train.dataprep'
                        ELSE 'train.step' END,
                   '[]', '{}', 0, 'succeeded', 1, 1, 300, '', '', '', now(), now(), now()
              FROM generate_series(0, %(count)s - 1) AS n ORDER BY n
            RETURNING id
            """,
            {"queue": queue, "retired": retired, "every": every, "count": count},
        )
        ids = sorted(pk for (pk,) in cursor.fetchall())
    settle()
    return ids


def settle() -> None:
    """What autovacuum does to a live table: the trigram index's pending entries moved
    into it (the planner prices a search by them), and the statistics taken."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT gin_clean_pending_list('inv_search'::regclass)")
        cursor.execute("ANALYZE jobs_invocation")


def rows_read(statements: list[str]) -> int:
    """How many rows the statements' scans read from the table (those they returned and
    those they read and dropped), by EXPLAIN ANALYZE of each, sequential scans priced out
    as a small test table would be read whole otherwise."""
    total = 0
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for sql in statements:
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
            (plan,) = cursor.fetchone()
            plan = json.loads(plan) if isinstance(plan, str) else plan
            total += _scanned(plan[0]["Plan"])
        cursor.execute("RESET enable_seqscan")
    return total


def _scanned(node: dict) -> int:
    read = 0
    if node["Node Type"] in SCANS:
        per_loop = (
            node["Actual Rows"]
            + node.get("Rows Removed by Filter", 0)
            + node.get("Rows Removed by Index Recheck", 0)
        )
        read = round(per_loop * node["Actual Loops"])
    return read + sum(_scanned(child) for child in node.get("Plans", []))


def captured(action) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        action()
    return [
        q["sql"]
        for q in ctx.captured_queries
        if q["sql"].lstrip().startswith("SELECT") and '"jobs_invocation"' in q["sql"]
    ]


# ---------------------------------------------------------------------------- the list


def test_matches_only_in_the_oldest_rows_are_read_from_the_index_not_by_walking(monkeypatch):
    monkeypatch.setattr(search, "SEARCH_RECENT_ROWS", 100)
    ids = fill(30_000, retired=3_000)
    found = []
    statements = captured(
        lambda: found.extend(search.newest(Invocation.objects.matching("legacy_sync"), 20))
    )
    assert [row.pk for row in found] == ids[:3_000][::-1][:20]  # the newest matches, in order
    # the recent rows walked, the matches' ids collected, the page's rows read by id:
    # never the 27,000 newer rows between
    assert rows_read(statements) <= 100 + 3_000 + 20 + 1
    # the negative control: the plain newest-first page walks every newer row first
    plain = Invocation.objects.matching("legacy_sync").order_by("-id")[:20]
    assert rows_read(captured(lambda: list(plain))) >= 27_000


def test_a_search_with_matches_among_the_newest_rows_reads_no_further(monkeypatch):
    monkeypatch.setattr(search, "SEARCH_RECENT_ROWS", 100)
    ids = fill(3_000, every=2)
    found = []
    statements = captured(
        lambda: found.extend(search.newest(Invocation.objects.matching("dataprep"), 20))
    )
    assert [row.pk for row in found] == [pk for pk in ids[::-1] if (pk - ids[0]) % 2 == 0][:20]
    assert rows_read(statements) <= 100 + 1  # the 1: the newest id


def test_a_search_with_sparse_recent_matches_walks_on_as_far_as_they_say(monkeypatch):
    monkeypatch.setattr(search, "SEARCH_RECENT_ROWS", 100)
    ids = fill(30_000, every=50)  # two matches among the newest 100 rows: 18 more in ~900
    found = []
    statements = captured(
        lambda: found.extend(search.newest(Invocation.objects.matching("dataprep"), 20))
    )
    assert [row.pk for row in found] == [pk for pk in ids[::-1] if (pk - ids[0]) % 50 == 0][:20]
    # walked on twice the guess at most: never the 600 matches fenced, never the table
    assert rows_read(statements) <= 100 + 1_800 + 1


def test_the_api_pages_a_search_newest_first_across_the_recent_edge(viewer, monkeypatch):
    monkeypatch.setattr(search, "SEARCH_RECENT_ROWS", 10)
    ids = fill(60, every=3)
    expected = [pk for pk in ids[::-1] if (pk - ids[0]) % 3 == 0]
    seen, url = [], "/api/v1/jobs/?search=dataprep&limit=7"
    while url:
        answer = viewer.get(url)
        assert answer.status_code == 200, answer.json()
        seen += [int(job["id"]) for job in answer.json()]
        link = re.search(r"<([^>]+)>", answer.get("Link", ""))
        url = link and link.group(1).replace("http://testserver", "")
    assert seen == expected  # every match once, newest first, whatever page it fell on


def test_the_console_pages_a_search_newest_first_across_the_recent_edge(ops_client, monkeypatch):
    monkeypatch.setattr(search, "SEARCH_RECENT_ROWS", 10)
    ids = fill(160, every=2)
    expected = [pk for pk in ids[::-1] if (pk - ids[0]) % 2 == 0]
    first = ops_client.get("/jobs/?search=dataprep")
    shown = [int(pk) for pk in re.findall(r'href="/jobs/(\d+)/"', first.content.decode())]
    assert list(dict.fromkeys(shown)) == expected[:50]
    older = ops_client.get(f"/jobs/?search=dataprep&after={expected[49]}")
    shown = [int(pk) for pk in re.findall(r'href="/jobs/(\d+)/"', older.content.decode())]
    assert list(dict.fromkeys(shown)) == expected[50:80]
    assert 'aria-label="Page 2"' in first.content.decode()  # the pager numbers its pages


# ---------------------------------------------------------------------------- bulk


def test_a_bulk_retry_of_a_search_starts_its_walk_at_the_oldest_match():
    builders.queue(name="train")
    ids = fill(30_000)
    newest = ids[-2_000:]
    Invocation.objects.update(state="failed")
    Invocation.objects.filter(pk__in=newest).update(function="train.dataprep")
    settle()
    statements = captured(
        lambda: services.invocation_bulk_retry(states=["failed"], search="dataprep")
    )
    assert Invocation.objects.filter(retry_of__in=newest).count() == 2_000
    Invocation.objects.filter(retry_of__isnull=False).delete()  # each statement read again
    # the matches found, then walked in batches: never the 28,000 older rows none match
    assert rows_read(statements) <= 3 * 2_000
    # the negative control: a batch's statement walking from the start reads them all
    plain = (
        Invocation.objects.filter(state="failed")
        .matching("dataprep")
        .exclude(id__in=Invocation.objects.filter(retry_of__isnull=False).values("retry_of"))
        .order_by("id")
        .values_list("id", "queue")[:500]
    )
    assert rows_read(captured(lambda: list(plain))) >= 28_000


# ---------------------------------------------------------------------------- too broad


@pytest.fixture
def hurried(settings):
    """A search timeout no read of a few thousand rows meets."""
    settings.LAKESHORE_SEARCH_TIMEOUT_SECONDS = 0.001
    fill(20_000, retired=5_000)
    return settings


def test_a_search_too_broad_to_read_in_time_is_refused_and_says_how_to_narrow(viewer, hurried):
    answer = viewer.get("/api/v1/jobs/?search=legacy_sync")
    assert_error(answer, 400, "search_too_broad", field="search", says=["narrow", "queue"])
    hurried.LAKESHORE_SEARCH_TIMEOUT_SECONDS = 10  # the negative control: time enough
    assert len(viewer.get("/api/v1/jobs/?search=legacy_sync").json()) == 50


def test_the_console_says_a_search_is_too_broad_beside_its_box(ops_client, hurried):
    page = ops_client.get("/jobs/?search=legacy_sync").content.decode()
    assert "matches too many jobs" in page and "narrow it" in page
    assert 'aria-invalid="true"' in page  # the Search box is marked


def test_a_bulk_retry_too_broad_is_refused_before_it_retries_any(operator, hurried):
    Invocation.objects.update(state="failed")
    body = {"state": ["failed"], "search": "legacy_sync"}
    answer = operator.post("/api/v1/jobs/bulk-retry/", body, format="json")
    assert_error(answer, 400, "search_too_broad", field="search")
    assert not Invocation.objects.filter(retry_of__isnull=False).exists()


# ---------------------------------------------------------------------------- statements


def test_a_search_page_reads_the_search_once_in_a_bounded_number_of_statements(
    viewer, ops_client, monkeypatch
):
    monkeypatch.setattr(search, "SEARCH_RECENT_ROWS", 10)
    for every in (2, 7, 0):  # dense, sparse (walked on, then fenced), none
        Invocation.objects.all().delete()
        fill(300, every=every)
        with CaptureQueriesContext(connection) as api:
            assert viewer.get("/api/v1/jobs/?search=dataprep").status_code == 200
        with CaptureQueriesContext(connection) as page:
            assert ops_client.get("/jobs/?search=dataprep").status_code == 200
        # a search is at most a walk, a walk on, the fenced rest's ids and their rows; the
        # console's first page and its pager share one search, then read the page by id
        for captured_queries, most in ((api.captured_queries, 4), (page.captured_queries, 5)):
            searched = [q["sql"][:80] for q in captured_queries if "'dataprep'" in q["sql"]]
            assert 1 <= len(searched) <= most, (every, searched)
