"""GET /api/v1/queues/NAME/events/ — `lakeshore queues events`."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.queues.events import event, events
from tests.support import builders
from tests.support.assertions import assert_error
from tests.support.shapes import EVENT_KEYS

pytestmark = pytest.mark.django_db

URL = "/api/v1/queues/q/events/"


@pytest.fixture
def q():
    return builders.queue(name="q", elasticity_spec={"kind": "fully_elastic"})


def next_url(response) -> str | None:
    link = response.get("Link")
    if not link:
        return None
    assert link.endswith('rel="next"')
    return link[link.index("<") + 1 : link.index(">")]


def test_it_lists_decisions_newest_first(operator, q):
    rows = events(q, ["scale_up", "hold", "scale_down", "launch_failed", "terminate_failed"])

    response = operator.get(URL)

    assert response.status_code == 200
    body = response.json()
    assert [e["id"] for e in body] == [str(e.pk) for e in reversed(rows)]
    assert [e["action"] for e in body] == [
        "terminate_failed",
        "launch_failed",
        "scale_down",
        "hold",
        "scale_up",
    ]
    assert "Link" not in response


def test_it_shows_an_event_in_the_spec_shape(operator, q):
    row = event(
        q,
        "scale_up",
        reason="U=0.92 ≥ 0.70, P=14: desired 5 → launching 2",
        daemons=3,
        busy=3,
        pending=14,
        utilization=0.92,
        desired=5,
        delta=2,
    )

    [body] = operator.get(URL).json()

    assert set(body) == EVENT_KEYS
    assert body["id"] == str(row.pk)
    assert body["at"].endswith("Z")
    assert body["action"] == "scale_up"
    assert body["reason"] == "U=0.92 ≥ 0.70, P=14: desired 5 → launching 2"
    assert (body["daemons"], body["busy"], body["pending"]) == (3, 3, 14)
    assert body["utilization"] == 0.92
    assert (body["desired"], body["delta"]) == (5, 2)


def test_it_hides_tick_noop_unless_verbose(operator, q):
    events(q, ["tick_noop", "scale_up", "tick_noop", "scale_down", "tick_noop"])

    quiet = operator.get(URL).json()
    verbose = operator.get(URL, {"verbose": "true"}).json()

    assert [e["action"] for e in quiet] == ["scale_down", "scale_up"]
    assert [e["action"] for e in verbose] == [
        "tick_noop",
        "scale_down",
        "tick_noop",
        "scale_up",
        "tick_noop",
    ]


def test_it_shows_only_this_queues_events(operator, q):
    other = builders.queue(name="other")
    mine = event(q)
    event(other)

    assert [e["id"] for e in operator.get(URL).json()] == [str(mine.pk)]


def test_it_shows_50_by_default(operator, q):
    events(q, ["scale_up"] * 60)

    response = operator.get(URL)

    assert len(response.json()) == 50
    assert "limit=50" in response["Link"]


def test_it_shows_up_to_200(operator, q):
    events(q, ["scale_up"] * 205)

    response = operator.get(URL, {"limit": 200, "verbose": "true"})

    assert response.status_code == 200
    assert len(response.json()) == 200
    assert response["Link"]


@pytest.mark.parametrize("limit", [0, 201, -1, "ten"])
def test_it_refuses_a_limit_out_of_range(operator, q, limit):
    response = operator.get(URL, {"limit": limit})

    assert_error(response, 400, "invalid", field="limit", says=str(limit))


@pytest.mark.parametrize("before", ["abc", "0", "-3"])
def test_it_refuses_a_bad_cursor(operator, q, before):
    response = operator.get(URL, {"before": before})

    assert_error(response, 400, "invalid", field="before")


def test_a_cursor_too_large_for_the_database_is_not_a_server_error(operator, q):
    event(q)

    response = operator.get(URL, {"before": 10**20})

    assert response.status_code in (200, 400)


def test_the_link_walks_every_event_once(operator, q):
    rows = events(q, ["scale_up", "tick_noop", "hold"] * 9)  # 18 decisions, 9 noops
    decisions = [str(e.pk) for e in reversed(rows) if e.action != "tick_noop"]

    seen, url, pages = [], f"{URL}?limit=5", 0
    while url:
        response = operator.get(url)
        assert response.status_code == 200
        seen += [e["id"] for e in response.json()]
        url, pages = next_url(response), pages + 1

    assert seen == decisions
    assert pages == 4


def test_the_link_keeps_verbose(operator, q):
    events(q, ["tick_noop"] * 3)

    first = operator.get(URL, {"verbose": "true", "limit": 2})
    second = operator.get(next_url(first))

    assert "verbose=true" in first["Link"]
    assert len(first.json()) == 2
    assert len(second.json()) == 1
    assert "Link" not in second


def test_an_empty_trail_is_an_empty_array(operator, q):
    response = operator.get(URL)

    assert response.status_code == 200
    assert response.json() == []


def test_it_answers_404_for_an_unknown_queue(operator):
    assert_error(operator.get("/api/v1/queues/nope/events/"), 404, "not_found", says="nope")


def test_it_runs_the_same_number_of_queries_for_1_and_50_events(operator, q):
    event(q)
    operator.get(URL)  # the first request of a token also stamps its last use

    with CaptureQueriesContext(connection) as one:
        assert len(operator.get(URL).json()) == 1
    events(q, ["scale_up"] * 49)
    with CaptureQueriesContext(connection) as fifty:
        assert len(operator.get(URL).json()) == 50

    assert len(fifty) == len(one)
