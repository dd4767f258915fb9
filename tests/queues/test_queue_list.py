"""GET /api/v1/queues/ — `lakeshore queues ls`."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import DaemonState
from queues import services
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

URL = "/api/v1/queues/"


def names(response) -> list[str]:
    return [row["name"] for row in response.json()]


def test_it_lists_queues_as_a_json_array_by_name(operator):
    builders.queue(name="b-queue")
    builders.queue(name="a-queue", kind="priority")

    response = operator.get(URL)

    assert response.status_code == 200
    assert isinstance(response.json(), list)
    assert names(response) == ["a-queue", "b-queue"]
    assert response.json()[0]["kind"] == "priority"
    assert "Link" not in response


def test_it_lists_nothing_as_an_empty_array(operator):
    response = operator.get(URL)

    assert response.status_code == 200
    assert response.json() == []


def test_it_hides_archived_queues_by_default(operator):
    builders.queue(name="live")
    builders.queue(name="gone")
    services.queue_transition(name="gone", action="archive")

    assert names(operator.get(URL)) == ["live"]
    assert names(operator.get(URL, {"state": "archived"})) == ["gone"]


@pytest.mark.parametrize("state", ["active", "draining", "paused"])
def test_it_filters_on_state(operator, state):
    for action, name in [("drain", "draining-q"), ("pause", "paused-q")]:
        builders.queue(name=name)
        services.queue_transition(name=name, action=action)
    builders.queue(name="active-q")

    response = operator.get(URL, {"state": state})

    assert response.status_code == 200
    assert names(response) == [f"{state}-q"]


def test_it_refuses_an_unknown_state(operator):
    response = operator.get(URL, {"state": "bogus"})

    assert_error(response, 400, "invalid", field="state", says="bogus")


def test_members_counts_live_daemons_only(operator):
    builders.queue(name="gpu")
    for state in ["provisioning", "idle", "busy", "draining"]:
        builders.daemon(queues=["gpu"], state=state)
    builders.daemon(queues=["gpu"], state=DaemonState.TERMINATED)
    builders.daemon(queues=["gpu"], state=DaemonState.LOST)
    builders.daemon(queues=[], state=DaemonState.IDLE)  # the default queue

    [row] = operator.get(URL).json()

    assert row["members"] == 4


def test_a_daemon_in_two_queues_counts_in_both(operator):
    builders.queue(name="a")
    builders.queue(name="b")
    builders.queue(name="c")
    builders.daemon(queues=["a", "b"])
    builders.daemon(queues=["b"])

    members = {row["name"]: row["members"] for row in operator.get(URL).json()}

    assert members == {"a": 1, "b": 2, "c": 0}


def test_members_does_not_match_a_prefix_of_the_name(operator):
    builders.queue(name="gpu")
    builders.queue(name="gpu-large")
    builders.daemon(queues=["gpu-large"])

    members = {row["name"]: row["members"] for row in operator.get(URL).json()}

    assert members == {"gpu": 0, "gpu-large": 1}


def test_it_pages_with_limit_and_offset(operator):
    for index in range(5):
        builders.queue(name=f"q{index}")

    first = operator.get(URL, {"limit": 2})
    last = operator.get(URL, {"limit": 2, "offset": 4})

    assert names(first) == ["q0", "q1"]
    assert 'rel="next"' in first["Link"]
    assert "limit=2" in first["Link"] and "offset=2" in first["Link"]
    assert names(last) == ["q4"]
    assert "Link" not in last


def test_following_the_link_walks_every_queue_once(operator):
    for index in range(7):
        builders.queue(name=f"q{index}")

    seen, url = [], f"{URL}?limit=3"
    while url:
        response = operator.get(url)
        seen += names(response)
        link = response.get("Link")
        url = link[link.index("<") + 1 : link.index(">")] if link else None

    assert seen == [f"q{index}" for index in range(7)]


def test_there_is_no_link_when_the_page_holds_the_last_row_exactly(operator):
    builders.queue(name="q1")
    builders.queue(name="q2")

    response = operator.get(URL, {"limit": 2})

    assert names(response) == ["q1", "q2"]
    assert "Link" not in response


def test_it_keeps_the_state_filter_in_the_link(operator):
    for index in range(3):
        builders.queue(name=f"q{index}")
        services.queue_transition(name=f"q{index}", action="archive")

    response = operator.get(URL, {"state": "archived", "limit": 1})

    assert "state=archived" in response["Link"]


def test_it_accepts_the_largest_limit(operator):
    builders.queue(name="q")

    assert operator.get(URL, {"limit": 1000}).status_code == 200


@pytest.mark.parametrize(
    "params, field",
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": -5}, "limit"),
        ({"limit": "abc"}, "limit"),
        ({"offset": -1}, "offset"),
        ({"offset": "x"}, "offset"),
    ],
)
def test_it_refuses_a_bad_page(operator, params, field):
    response = operator.get(URL, params)

    value = str(next(iter(params.values())))
    assert_error(response, 400, "invalid", field=field, says=value)


def test_it_refuses_an_offset_too_large_for_the_database(operator):
    response = operator.get(URL, {"offset": 10**20})

    assert_error(response, 400, "invalid", field="offset")


def _queues_with_members(count: int, start: int = 0) -> None:
    for index in range(start, start + count):
        name = f"q{index:03}"
        builders.queue(name=name, provider=builders.provider().name)
        builders.daemon(queues=[name])
        builders.daemon(queues=[name], state=DaemonState.BUSY)


def test_it_runs_the_same_number_of_queries_for_1_and_50_queues(operator):
    _queues_with_members(1)
    operator.get(URL)  # the first request of a token also stamps its last use

    with CaptureQueriesContext(connection) as one:
        assert len(operator.get(URL).json()) == 1
    _queues_with_members(49, start=1)
    with CaptureQueriesContext(connection) as fifty:
        response = operator.get(URL)

    assert len(response.json()) == 50
    assert sum(row["members"] for row in response.json()) == 100
    assert len(fifty) == len(one)
