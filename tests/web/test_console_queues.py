from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.roles import grant
from jobs.models import Invocation
from jobs.services import invocation_submit
from queues.models import QueueSample
from queues.services import queue_transition
from queues.views import QueueListPage, short_age
from tests.support import builders

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(client):
    user = get_user_model().objects.create_user("alice", password="pw-for-tests-only")
    grant(user, "viewer")  # the console needs a role (tests/web/test_console_roles.py)
    client.force_login(user)
    return client


def test_it_asks_for_a_login(client):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_it_lists_queues_with_members_and_elasticity(alice):
    builders.queue(
        name="training-h100",
        elasticity_spec={"kind": "pool_with_threshold", "min": 2, "max": 16, "threshold": 0.7},
    )
    builders.daemon(queues=["training-h100"])
    builders.queue(name="retired-queue")
    queue_transition(name="retired-queue", action="archive")
    body = alice.get("/").content.decode()
    assert "training-h100" in body and "pool-with-threshold 2..16 @0.7" in body
    assert ">1</td>" in body  # one member
    assert "retired-queue" not in body  # archived queues are hidden unless asked for


def test_an_htmx_request_gets_only_the_table(alice):
    builders.queue(name="retired-queue")
    queue_transition(name="retired-queue", action="archive")
    response = alice.get(
        "/?state=archived", headers={"HX-Request": "true", "HX-Target": "queue-table"}
    )
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="queue-table"')
    assert "retired-queue" in body and "<html" not in body


def test_it_costs_the_same_queries_for_1_and_50_queues(alice):
    def count():
        with CaptureQueriesContext(connection) as ctx:
            assert alice.get("/").status_code == 200
        return len(ctx)

    builders.queue(name="q0")
    one = count()
    for i in range(1, 50):
        builders.queue(name=f"q{i}")
        builders.daemon(queues=[f"q{i}"])
    assert count() == one


def test_it_says_how_to_add_a_queue_when_there_is_none(alice):
    assert "lakeshore queues add NAME" in alice.get("/").content.decode()


@pytest.mark.parametrize("url", ["/?after=%00", f"/?after={'x' * 100}", "/?before=%00"])
def test_a_garbled_page_key_shows_the_first_page(alice, url):
    builders.queue(name="training-h100")
    response = alice.get(url)
    assert response.status_code == 200 and "training-h100" in response.content.decode()


# ---------------------------------------------------------------------------- backlog


class _Table(HTMLParser):
    """The queue table as {queue name: {column header: (text, title)}}."""

    def __init__(self):
        super().__init__()
        self.headers, self.rows, self.cell, self.row = [], [], None, None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.row = []
        elif tag in ("td", "th"):
            self.cell = ["", dict(attrs).get("title")]

    def handle_data(self, data):
        if self.cell is not None:
            self.cell[0] += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.row.append((" ".join(self.cell[0].split()), self.cell[1]))
            self.cell = None
        elif tag == "tr" and self.row is not None:
            if not self.headers:
                self.headers = [text for text, _ in self.row]
            else:
                self.rows.append(dict(zip(self.headers, self.row, strict=True)))
            self.row = None


def queue_rows(client, url: str = "/") -> dict[str, dict[str, tuple[str, str | None]]]:
    response = client.get(url)
    assert response.status_code == 200
    table = _Table()
    body = response.content.decode()
    table.feed(body[body.index('id="queue-table"') :])  # not the dashboard's errors above
    return {row["Name"][0]: row for row in table.rows}


def invocation(queue: str, state: str = "queued", **fields) -> Invocation:
    return Invocation.objects.create(
        queue=queue, function="lakeshore.functions.echo", state=state, **fields
    )


def test_a_paused_queue_shows_what_it_holds(alice):
    builders.queue(name="held")
    queue_transition(name="held", action="pause")
    for i in range(30):
        invocation_submit(function="lakeshore.functions.echo", queue="held", args=[i])

    row = queue_rows(alice)["held"]
    assert row["State"][0] == "paused"
    assert row["Pending"][0] == "30"
    assert row["Running"][0] == "0"


def test_each_queue_shows_its_backlog_failures_oldest_wait_and_daemons(alice):
    now = timezone.now()
    builders.queue(name="train")
    builders.queue(name="idle-queue")
    builders.queue(name="other")
    oldest = invocation("train")  # the first submitted: ids follow submit times
    Invocation.objects.filter(pk=oldest.pk).update(created_at=now - timedelta(minutes=3, seconds=5))
    for _ in range(3):
        invocation("train")
    invocation("train", "running", started_at=now)
    invocation("train", "running", started_at=now)
    invocation("train", "failed", finished_at=now - timedelta(hours=1))
    invocation("train", "failed", finished_at=now - timedelta(hours=25))  # too old
    invocation("train", "succeeded", finished_at=now)
    invocation("train", "succeeded", finished_at=now - timedelta(minutes=30))
    invocation("train", "succeeded", finished_at=now - timedelta(minutes=61))  # too old
    invocation("train", "killed", finished_at=now)
    invocation("other", "queued")  # another queue's rows stay its own
    invocation("", "failed", finished_at=now)  # the default queue's too
    builders.daemon(queues=["train"], state="busy")
    builders.daemon(queues=["train", "other"], state="idle")
    builders.daemon(queues=["train"], state="provisioning")
    builders.daemon(queues=["train"], state="terminated")  # not live: not counted

    rows = queue_rows(alice)

    train = rows["train"]
    assert train["Pending"][0] == "4"
    assert train["Running"][0] == "2"
    assert train["Failed 24 h"][0] == "1"
    assert train["Succeeded 1 h"][0] == "2"
    assert train["Oldest wait"][0] == "3 min"
    assert train["Oldest wait"][1].startswith("queued since ")
    assert (now - timedelta(minutes=3, seconds=5)).strftime("%Y-%m-%d %H:%M") in train[
        "Oldest wait"
    ][1]
    assert train["Daemons"][0] == "3"  # live: busy, idle, provisioning
    assert train["Busy / idle"][0] == "1 / 1"
    other = rows["other"]
    assert (other["Pending"][0], other["Failed 24 h"][0], other["Busy / idle"][0]) == (
        "1",
        "0",
        "0 / 1",
    )
    empty = rows["idle-queue"]
    columns = ("Pending", "Running", "Succeeded 1 h", "Failed 24 h", "Oldest wait")
    assert [empty[c][0] for c in columns] == ["0", "0", "0", "0", "-"]
    assert empty["Oldest wait"][1] is None
    assert empty["Busy / idle"][0] == "0 / 0"


def test_failures_link_to_the_queues_failed_jobs(alice):
    builders.queue(name="train")
    invocation("train", "failed", finished_at=timezone.now())
    body = alice.get("/").content.decode()
    assert 'href="/jobs/?queue=train&amp;state=failed"' in body


def test_the_htmx_table_carries_the_backlog_too(alice):
    builders.queue(name="train")
    invocation("train")
    body = alice.get(
        "/", headers={"HX-Request": "true", "HX-Target": "queue-table"}
    ).content.decode()
    assert body.lstrip().startswith('<div id="queue-table"')
    table = _Table()
    table.feed(body)
    assert [row["Name"][0] for row in table.rows] == ["(default)", "train"]
    assert table.rows[1]["Pending"][0] == "1"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0 s"), (59, "59 s"), (60, "1 min"), (3599, "59 min"), (7200, "2 h"), (90000, "1 d")],
)
def test_ages_read_short(seconds, shown):
    assert short_age(timedelta(seconds=seconds)) == shown


def test_the_backlog_costs_the_same_queries_for_1_and_50_busy_queues(alice):
    def count():
        with CaptureQueriesContext(connection) as ctx:
            assert alice.get("/").status_code == 200
        return len(ctx)

    def busy_queue(name):
        queue = builders.queue(name=name)
        for state in ("queued", "queued", "running", "failed"):
            invocation(name, state, finished_at=timezone.now())
        builders.daemon(queues=[name], state="busy")
        builders.daemon(queues=[name], state="idle")
        minute = timezone.now().replace(second=0, microsecond=0)
        QueueSample.objects.bulk_create(
            QueueSample(
                queue=queue, at=minute - timedelta(minutes=m), pending=m, running=1,
                daemons=2, busy=1, desired=2, utilization=0.5,
            )
            for m in range(59)  # not 60: the page may be drawn in the next minute
        )  # fmt: skip

    busy_queue("q0")
    one = count()
    for i in range(1, 50):
        busy_queue(f"q{i}")
    assert count() == one
    rows = queue_rows(alice)
    assert len(rows) == 51 and "(default)" in rows  # the default queue first
    # the sparkline of pending over the last hour, from the page's one query of samples
    del rows["(default)"]  # no samples of its own here
    # (the cell's text: the SVG's title, then each sample's, "15:11 — 0 pending")
    spark = "pending 58 → 0 over the last hour"
    assert all(row["Last hour"][0].startswith(spark) for row in rows.values())
    assert all(row["Last hour"][0].endswith(" — 0 pending") for row in rows.values())


# ---------------------------------------------------------------------------- the default queue


def test_the_default_queue_is_listed_first_with_its_figures_and_sparkline(alice):
    now = timezone.now()
    builders.queue(name="train")
    oldest = invocation("")
    Invocation.objects.filter(pk=oldest.pk).update(created_at=now - timedelta(minutes=2))
    invocation("")
    invocation("", "running", started_at=now)
    invocation("", "failed", finished_at=now)
    invocation("train")  # not the default queue's
    builders.daemon(queues=[], state="busy")
    builders.daemon(queues=[], state="idle")
    builders.daemon(queues=["train"], state="idle")  # not the default queue's
    minute = now.replace(second=0, microsecond=0)
    QueueSample.objects.bulk_create(
        QueueSample(
            queue=None, at=minute - timedelta(minutes=m), pending=m, running=1,
            daemons=2, busy=1, desired=2, utilization=0.5,
        )
        for m in range(3)
    )  # fmt: skip

    response = alice.get("/")
    body = response.content.decode()
    table = _Table()
    table.feed(body[body.index('id="queue-table"') :])
    assert [row["Name"][0] for row in table.rows] == ["(default)", "train"]
    default = table.rows[0]
    assert [default[c][0] for c in ("Pending", "Running", "Failed 24 h", "Oldest wait")] == [
        "2", "1", "1", "2 min",
    ]  # fmt: skip
    assert (default["Daemons"][0], default["Busy / idle"][0]) == ("2", "1 / 1")
    assert default["Last hour"][0].startswith("pending 2 → 0 over the last hour")
    assert 'href="/queues/(default)/"' in body
    assert 'href="/jobs/?queue=%28default%29&amp;state=failed"' in body
    assert "No named queues yet" not in body


def test_the_default_queue_is_on_the_first_page_only_and_only_for_active_queues(alice, monkeypatch):
    monkeypatch.setattr(QueueListPage, "page_size", 2)
    for i in range(3):
        builders.queue(name=f"q{i}")
    builders.queue(name="held")
    queue_transition(name="held", action="pause")
    assert list(queue_rows(alice)) == ["(default)", "held", "q0"]
    assert list(queue_rows(alice, "/?after=q0")) == ["q1", "q2"]
    assert list(queue_rows(alice, "/?before=q1")) == ["(default)", "held", "q0"]
    assert "(default)" in queue_rows(alice, "/?state=active")
    assert list(queue_rows(alice, "/?state=paused")) == ["held"]


def test_with_no_named_queue_the_list_shows_the_default_queue_and_how_to_add_one(alice):
    body = alice.get("/").content.decode()
    assert "(default)" in body and "No named queues yet" in body
    assert "lakeshore queues add NAME" in body


def test_the_default_queues_page_shows_its_figures_members_and_no_edit_or_actions(alice):
    invocation("")
    invocation("", "running", started_at=timezone.now())
    member = builders.daemon(queues=[], state="busy")
    builders.daemon(queues=["other"], state="idle")
    response = alice.get("/queues/(default)/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "<h1>(default)" in body
    assert f'href="/daemons/?id={member.pk}"' in body
    assert "Edit" not in body and 'action="/queues/' not in body  # read-only
    assert "Pending</dt><dd>1</dd>" in body and "Running</dt><dd>1</dd>" in body
    assert 'href="/jobs/?queue=%28default%29"' in body
    chart = alice.get(
        "/queues/(default)/?range=day",
        headers={"HX-Request": "true", "HX-Target": "queue-chart"},
    )
    assert chart.status_code == 200


def test_the_default_queue_with_no_daemon_says_how_to_start_one(alice):
    body = alice.get("/queues/(default)/").content.decode()
    assert "No member daemons" in body and "<code>lakeshore daemon run</code>" in body
    grant(get_user_model().objects.get(username="alice"), "operator")
    body = alice.get("/queues/(default)/").content.decode()
    assert "Edit" not in body and "Archive" not in body  # nothing to edit, no state to change
    assert alice.get("/queues/(default)/edit/").status_code == 404
    alice.post("/queues/(default)/archive/")
    assert "was not changed" in alice.get("/queues/(default)/").content.decode()


def test_the_default_queues_jobs_link_lists_its_jobs_only(alice):
    builders.queue(name="gpu")
    mine = invocation("")
    other = invocation("gpu")
    body = alice.get("/jobs/?queue=%28default%29").content.decode()
    assert f'href="/jobs/{mine.pk}/"' in body and f'href="/jobs/{other.pk}/"' not in body
    api = APIClient()  # the API's filter reads it too
    api.credentials(**builders.auth(builders.token("viewer")))
    assert [job["id"] for job in api.get("/api/v1/jobs/?queue=(default)").json()] == [str(mine.pk)]
