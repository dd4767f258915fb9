"""The queue page's chart and the queue list's sparklines: inline SVG drawn on the
server from the samples the controller's tick records (queues/samples.py)."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.roles import grant
from fleet import controller
from jobs.models import Invocation
from queues import charts, samples
from queues.models import QueueEvent, QueueSample
from tests.support import builders

pytestmark = pytest.mark.django_db

EMPTY = "No samples yet: the controller samples every tick"


@pytest.fixture
def viewer(client):
    user = get_user_model().objects.create_user("viewer-user", password="pw-for-tests-only")
    grant(user, "viewer")
    client.force_login(user)
    return client


def _minute():
    return samples.minute_of(timezone.now())


def _sample(queue, minutes_ago: int, pending: int, running=0, daemons=0, desired=0):
    return QueueSample.objects.create(
        queue=queue,
        at=_minute() - timedelta(minutes=minutes_ago),
        pending=pending,
        running=running,
        daemons=daemons,
        busy=0,
        desired=desired,
        utilization=0.0,
    )


def _svgs(body: str) -> list[str]:
    """The SVGs of the signals chart (the page's what-ended panels come after it)."""
    if 'id="queue-ended"' in body:
        body = body[: body.index('id="queue-ended"')]
    return re.findall(r"<svg\b.*?</svg>", body, flags=re.S)


def _label(svg: str) -> str:
    return re.search(r'aria-label="([^"]*)"', svg).group(1)


def test_the_chart_says_in_words_what_it_shows(viewer):
    queue = builders.queue(name="train")
    _sample(queue, 50, 30, running=1, daemons=1, desired=3)
    _sample(queue, 20, 41, running=3, daemons=3, desired=3)
    _sample(queue, 0, 12, running=4, daemons=3, desired=2)
    body = viewer.get("/queues/train/").content.decode()
    work, pool = _svgs(body)  # two panels, each on its own y axis
    assert _label(work) == (
        "Work on queue train, last hour: pending 30 → 12 (peak 41), running 1 → 4."
    )
    assert _label(pool) == (
        "Daemons on queue train, last hour: daemons 1 → 3, desired daemons 3 → 2."
    )
    for svg, keys in ((work, ("pending", "running")), (pool, ("daemons", "desired"))):
        assert 'role="img"' in svg
        assert f"<title>{_label(svg)}</title>" in svg
        for key in keys:
            assert f'class="chart-line line-{key}"' in svg
    assert "Signals over the last hour" in body
    assert "pending 30 → 12 (peak 41)</li>" in body  # the legend under the chart


def test_each_panel_has_its_own_scale(viewer):
    queue = builders.queue(name="train")
    _sample(queue, 1, 5000, daemons=2, desired=2)
    work, pool = _svgs(viewer.get("/queues/train/").content.decode())
    assert ">5000</text>" in work and ">2</text>" in pool
    daemons = re.search(r'class="chart-line line-daemons" points="([^"]*)"', pool).group(1)
    assert daemons.split()[0].split(",")[1] == f"{charts.TOP:.1f}"  # 2 of 2: the top


def test_the_lines_follow_the_samples_and_break_where_samples_are_missing(viewer):
    queue = builders.queue(name="train")
    for minutes_ago in (40, 39, 38, 10, 9):
        _sample(queue, minutes_ago, 10)
    svg = _svgs(viewer.get("/queues/train/").content.decode())[0]
    pending = re.findall(r'class="chart-line line-pending" points="([^"]*)"', svg)
    assert [len(points.split()) for points in pending] == [3, 2]  # a gap of 28 minutes
    # the y axis tops at 10: a line at 10 runs along the top of the plot
    assert {point.split(",")[1] for points in pending for point in points.split()} == {
        f"{charts.TOP:.1f}"
    }


def test_a_slow_tick_does_not_break_the_lines(viewer, settings):
    settings.LAKESHORE_TICK_SECONDS = 180  # a sample every third minute is no gap
    queue = builders.queue(name="train")
    for minutes_ago in (9, 6, 3, 0):
        _sample(queue, minutes_ago, 10)
    svg = _svgs(viewer.get("/queues/train/").content.decode())[0]
    pending = re.findall(r'class="chart-line line-pending" points="([^"]*)"', svg)
    assert [len(points.split()) for points in pending] == [4]


def test_a_day_shows_what_the_hour_does_not(viewer):
    queue = builders.queue(name="train")
    _sample(queue, 180, 500)  # three hours ago
    _sample(queue, 5, 7)
    hour = viewer.get("/queues/train/").content.decode()
    day = viewer.get("/queues/train/?range=day").content.decode()
    assert "pending 7 → 7" in _label(_svgs(hour)[0])
    assert "pending 500 → 7" in _label(_svgs(day)[0])
    assert "Signals over the last day" in day
    assert re.search(r'\?range=day"[^>]*aria-current="page"', day, flags=re.S)
    assert re.search(r'\?range=hour"[^>]*aria-current="page"', hour, flags=re.S)
    assert "−24 h" in day and "−60 min" in hour


@pytest.mark.parametrize("value", ["week", "", "HOUR", "day;drop"])
def test_a_bad_range_is_the_hour(viewer, value):
    queue = builders.queue(name="train")
    _sample(queue, 180, 500)
    _sample(queue, 5, 7)
    response = viewer.get("/queues/train/", {"range": value})
    assert response.status_code == 200
    assert "pending 7 → 7" in _label(_svgs(response.content.decode())[0])


def test_without_samples_the_chart_says_so(viewer):
    queue = builders.queue(name="train")
    _sample(queue, 120, 3)  # out of the hour
    body = viewer.get("/queues/train/").content.decode()
    assert f"{EMPTY}." in body and not _svgs(body)
    assert _svgs(viewer.get("/queues/train/?range=day").content.decode())


def test_htmx_gets_the_chart_or_its_figure_alone(viewer):
    queue = builders.queue(name="train")
    _sample(queue, 1, 4)
    chart = viewer.get(
        "/queues/train/?range=day", headers={"HX-Request": "true", "HX-Target": "queue-chart"}
    ).content.decode()
    assert chart.lstrip().startswith('<section id="queue-chart"')
    assert "<html" not in chart and "Signals over the last day" in chart
    figure = viewer.get(
        "/queues/train/?range=day",
        headers={"HX-Request": "true", "HX-Target": "queue-chart-figure"},
    ).content.decode()
    assert figure.lstrip().startswith('<div id="queue-chart-figure"')
    assert 'hx-trigger="every 60s"' in figure and "?range=day" in figure
    summary = viewer.get(
        "/queues/train/", headers={"HX-Request": "true", "HX-Target": "queue-summary"}
    ).content.decode()
    assert summary.lstrip().startswith('<section id="queue-summary"') and "<svg" not in summary
    missing = viewer.get(
        "/queues/nope/", headers={"HX-Request": "true", "HX-Target": "queue-chart"}
    )
    assert missing.status_code == 404


def test_the_page_has_no_inline_styles_or_scripts(viewer):
    queue = builders.queue(name="train")
    _sample(queue, 1, 4)
    body = viewer.get("/queues/train/").content.decode()
    assert " style=" not in body
    assert not re.search(r"<script(?![^>]*\bsrc=)", body)  # only scripts from files


def test_a_real_tick_feeds_the_chart(viewer):
    builders.queue(name="train")
    Invocation.objects.bulk_create([Invocation(queue="train", function="x.y") for _ in range(3)])
    controller.tick()
    work, pool = _svgs(viewer.get("/queues/train/").content.decode())
    assert _label(work).endswith("pending 3 → 3, running 0 → 0.")
    assert _label(pool).endswith("daemons 0 → 0, desired daemons 0 → 0.")


def test_the_legend_explains_d_b_p_u_next_to_the_decisions(viewer):
    queue = builders.queue(name="train")
    QueueEvent.objects.create(
        queue=queue, at=timezone.now(), action="scale_up", reason="r", daemons=1, busy=1,
        pending=2, utilization=1.0, desired=2, delta=1,
    )  # fmt: skip
    body = viewer.get("/queues/train/").content.decode()
    legend = re.search(r'<dl id="decision-legend".*?</dl>', body, flags=re.S).group(0)
    for letter, word in (("D", "daemons"), ("B", "busy"), ("P", "pending"), ("U", "utilisation")):
        assert f"<dt>{letter}</dt><dd>{word}:" in legend
        assert f'<abbr title="{word}">{letter}</abbr>' in body
    assert '<table class="stack" aria-describedby="decision-legend">' in body


# ---------------------------------------------------------------------------- the list


def _list_cells(body: str) -> dict[str, str]:
    """{queue name: the "Last hour" cell's markup}."""
    cells = {}
    for row in re.findall(r"<tr>(.*?)</tr>", body, flags=re.S):
        name = re.search(r'<a href="/queues/([^/]+)/">', row)
        spark = re.search(r'<td class="spark"[^>]*>(.*?)</td>', row, flags=re.S)
        if name and spark:
            cells[name.group(1)] = spark.group(1)
    return cells


def test_each_queue_on_the_list_has_a_sparkline_of_pending(viewer):
    train = builders.queue(name="train")
    builders.queue(name="quiet")
    _sample(train, 59, 30)
    _sample(train, 30, 45)
    _sample(train, 0, 12)
    body = viewer.get("/").content.decode()
    assert '<th class="spark">Last hour</th>' in body
    cells = _list_cells(body)
    (svg,) = _svgs(cells["train"])
    assert _label(svg) == "pending 30 → 12 (peak 45) over the last hour (scale 0 to 50)"
    assert 'class="sparkline"' in svg and 'role="img"' in svg
    assert len(re.findall(r'class="spark-line" points="([^"]*)"', svg)) == 3  # gaps
    assert "<svg" not in cells["quiet"] and EMPTY in cells["quiet"]
    htmx = viewer.get("/", headers={"HX-Request": "true"}).content.decode()
    assert "pending 30 → 12 (peak 45) over the last hour" in htmx


# ---------------------------------------------------------------------------- cost


def _queries(client, url) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx)


def test_the_chart_costs_one_query_whatever_the_samples_and_range(viewer):
    queue = builders.queue(name="train")
    empty = _queries(viewer, "/queues/train/")
    for minutes_ago in range(0, 24 * 60, 7):
        _sample(queue, minutes_ago, minutes_ago % 13, daemons=1, desired=2)
    assert _queries(viewer, "/queues/train/") == empty
    assert _queries(viewer, "/queues/train/?range=day") == empty
    with CaptureQueriesContext(connection) as ctx:
        viewer.get("/queues/train/", headers={"HX-Request": "true", "HX-Target": "queue-chart"})
    chart_queries = [q["sql"] for q in ctx.captured_queries if "queues_queuesample" in q["sql"]]
    assert len(chart_queries) == 1


def test_the_sparklines_cost_one_query_for_the_page(viewer):
    queue = builders.queue(name="q0")
    _sample(queue, 1, 1)
    with CaptureQueriesContext(connection) as ctx:
        viewer.get("/")
    one = len(ctx)
    assert len([q for q in ctx.captured_queries if "queues_queuesample" in q["sql"]]) == 1
    for i in range(1, 30):
        queue = builders.queue(name=f"q{i}")
        for minutes_ago in range(0, 60, 3):
            _sample(queue, minutes_ago, i)
    assert _queries(viewer, "/") == one
