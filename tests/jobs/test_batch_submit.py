"""Batch submit: one INSERT for the whole batch, idempotent keys and max_depth still
honoured, answers in the order sent, up to 10,000 a request."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs import services
from jobs.models import Invocation
from queues.services import queue_transition
from tests.support import builders

pytestmark = pytest.mark.django_db

ECHO = "lakeshore.functions.echo"


def _post(operator, batch):
    return operator.post("/api/v1/jobs/", batch, format="json")


def test_it_answers_in_the_order_sent_with_what_was_stored(operator):
    builders.queue(name="a")
    builders.queue(name="b", kind="priority")
    batch = [
        {"function": ECHO, "queue": "b", "args": [1], "priority": 5},
        {"function": ECHO, "args": [2], "kwargs": {"x": [1, {"y": None}]}},
        {"function": ECHO, "queue": "a", "args": [3], "timeout_s": 9, "max_attempts": 3},
    ]
    response = _post(operator, batch)
    assert response.status_code == 201
    body = response.json()
    assert [item["args"] for item in body] == [[1], [2], [3]]
    assert [item["queue"] for item in body] == ["b", "", "a"]
    assert body[0]["priority"] == 5 and body[1]["kwargs"] == {"x": [1, {"y": None}]}
    assert (body[2]["timeout_s"], body[2]["max_attempts"], body[2]["state"]) == (9, 3, "queued")
    assert [int(i["id"]) for i in body] == sorted(int(i["id"]) for i in body)


def test_keys_already_used_and_repeated_in_the_batch_answer_the_first(operator):
    builders.queue(name="a")
    first, _ = services.invocation_submit(function=ECHO, queue="a", key="k1")
    batch = [
        {"function": ECHO, "queue": "a", "key": "k1"},
        {"function": ECHO, "queue": "a", "key": "k2"},
        {"function": ECHO, "queue": "a", "key": "k2"},
        {"function": ECHO, "queue": "a"},
    ]
    results = services.invocation_submit_batch([dict(i) for i in batch])
    ids = [inv.pk for inv, _ in results]
    assert ids[0] == first.pk and ids[1] == ids[2] and len(set(ids)) == 3
    assert [made for _, made in results] == [False, True, False, True]
    assert Invocation.objects.filter(queue="a").count() == 3


def test_each_answer_says_whether_it_queued_the_invocation(operator):
    builders.queue(name="a")
    services.invocation_submit(function=ECHO, queue="a", key="k1")
    batch = [
        {"function": ECHO, "queue": "a", "key": "k1"},
        {"function": ECHO, "queue": "a", "key": "k2"},
        {"function": ECHO, "queue": "a", "key": "k2"},
        {"function": ECHO, "queue": "a"},
    ]
    body = _post(operator, batch).json()
    assert [item["created"] for item in body] == [False, True, False, True]
    assert body[1]["id"] == body[2]["id"]
    again = operator.post("/api/v1/jobs/", {**batch[1]}, format="json")
    fresh = operator.post("/api/v1/jobs/", {**batch[1], "key": "k3"}, format="json")
    assert (again.status_code, again.json()["created"]) == (200, False)
    assert (fresh.status_code, fresh.json()["created"]) == (201, True)


def test_a_batch_of_only_known_keys_answers_200(operator):
    builders.queue(name="a")
    services.invocation_submit(function=ECHO, queue="a", key="k")
    assert _post(operator, [{"function": ECHO, "queue": "a", "key": "k"}]).status_code == 200


def test_a_bounded_queue_takes_the_batch_only_if_it_all_fits(operator):
    builders.queue(name="small", max_depth=3)
    services.invocation_submit(function=ECHO, queue="small")
    refused = _post(operator, [{"function": ECHO, "queue": "small"}] * 3)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "backlog_full"
    assert "this batch adds 3" in refused.json()["error"]["message"]
    assert _post(operator, [{"function": ECHO, "queue": "small"}] * 2).status_code == 201
    assert Invocation.objects.filter(queue="small").count() == 3


def test_repeated_keys_count_once_against_max_depth(operator):
    builders.queue(name="small", max_depth=1)
    batch = [{"function": ECHO, "queue": "small", "key": "same"}] * 5
    assert _post(operator, batch).status_code == 201
    assert Invocation.objects.filter(queue="small").count() == 1


def test_a_queue_that_admits_nothing_refuses_the_whole_batch(operator):
    builders.queue(name="a")
    builders.queue(name="closing")
    queue_transition(name="closing", action="drain")
    batch = [{"function": ECHO, "queue": "a"}, {"function": ECHO, "queue": "closing"}]
    response = _post(operator, batch)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "queue_not_admitting"
    assert not Invocation.objects.exists()


def test_an_unknown_queue_or_a_private_function_refuses_the_batch(operator):
    builders.queue(name="a")
    unknown = _post(operator, [{"function": ECHO, "queue": "a"}, {"function": ECHO, "queue": "x"}])
    private = _post(operator, [{"function": "os._exit", "queue": "a"}])
    assert (unknown.status_code, private.status_code) == (404, 400)
    assert not Invocation.objects.exists()


@pytest.mark.parametrize("size", [0, 10_001])
def test_a_batch_holds_1_to_10000(operator, size):
    response = _post(operator, [{"function": ECHO}] * size)
    assert response.status_code == 400
    assert "1 to 10,000" in response.json()["error"]["message"]


def test_a_batch_costs_the_same_queries_for_10_and_1000_items():
    builders.queue(name="a", max_depth=5000)

    def count(n):
        batch = [{"function": ECHO, "queue": "a", "args": [i], "key": f"{n}-{i}"} for i in range(n)]
        with CaptureQueriesContext(connection) as ctx:
            services.invocation_submit_batch(batch)
        return len(ctx.captured_queries)

    assert count(10) == count(1000)
    assert Invocation.objects.count() == 1010
