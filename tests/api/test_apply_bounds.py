"""Issue 29, item 3: an apply holds no more of the database than it must. A viewer may
not plan one (403 before the body is read); one apply runs at a time (409
`apply_in_progress` at once, not a wait that holds a connection); a row another
request holds is waited for at most LAKESHORE_APPLY_LOCK_TIMEOUT (503 `busy`); a
document's providers and queues are counted before any is validated
(LAKESHORE_APPLY_MAX_ITEMS). Against the real PostgreSQL: the lock and the row are held
by a connection of their own, as another server process would hold them."""

import threading

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import declarative
from queues.models import Queue
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

APPLY = "/api/v1/apply/"
PROBE_QUEUES = 70_000  # the review's probe: one viewer dry run of 70,000 queues


def apply(client, document, **options):
    return client.post(APPLY, {"document": document, **options}, format="json")


def queues(count: int) -> dict:
    return {"queues": [{"name": f"q{i}", "kind": "fifo"} for i in range(count)]}


def other_session() -> psycopg.Connection:
    """A connection of its own to the test database (another server process's)."""
    return psycopg.connect(**connection.get_connection_params(), autocommit=True)


def test_a_viewers_big_dry_run_is_refused_before_its_body_is_read(viewer):
    with CaptureQueriesContext(connection) as queries:
        response = apply(viewer, queues(PROBE_QUEUES), dry_run=True)

    assert_error(response, 403, "permission_denied", says="operator")
    assert len(queries) <= 3  # the token, nothing of the document


def test_control_an_operators_dry_run_plans(operator):
    response = apply(operator, queues(3), dry_run=True)

    assert response.status_code == 200, response.json()
    assert [item["action"] for item in response.json()["items"]] == ["create"] * 3
    assert not Queue.objects.exists()


def test_an_apply_while_another_holds_the_lock_is_refused_at_once(operator):
    holder = other_session()
    holder.execute("SELECT pg_advisory_lock(hashtext(%s))", [declarative.APPLY_LOCK])
    # Were the apply to wait for the lock, it would get it when this lets go, and apply.
    letting_go = threading.Timer(10, holder.close)
    letting_go.start()
    try:
        response = apply(operator, queues(1))
    finally:
        letting_go.cancel()
        holder.close()

    assert_error(response, 409, "apply_in_progress", says="another apply")
    assert not Queue.objects.exists()
    # control: the lock free, the same apply applies
    assert apply(operator, queues(1)).status_code == 200
    assert Queue.objects.filter(name="q0").exists()


def test_a_document_over_the_limit_is_refused_before_any_item_is_validated(operator, settings):
    settings.LAKESHORE_APPLY_MAX_ITEMS = 5
    not_items = {"queues": [{"no": "such field"}] * 4, "providers": [7, None]}  # 6 items

    with CaptureQueriesContext(connection) as queries:
        response = apply(operator, not_items, dry_run=True)

    error = assert_error(response, 400, "invalid", says="LAKESHORE_APPLY_MAX_ITEMS")
    assert list(error["fields"]) == ["document"]  # no item's own error: none was looked at
    assert "6 providers and queues" in error["message"]
    assert len(queries) <= 3


def test_the_reviews_probe_costs_no_item(operator):
    with CaptureQueriesContext(connection) as queries:
        response = apply(operator, queues(PROBE_QUEUES), dry_run=True)

    error = assert_error(response, 400, "invalid", says="LAKESHORE_APPLY_MAX_ITEMS")
    assert list(error["fields"]) == ["document"]
    assert len(queries) <= 3


def test_control_a_document_at_the_limit_is_applied(operator, settings):
    settings.LAKESHORE_APPLY_MAX_ITEMS = 5

    response = apply(operator, {**queues(4), "providers": [{"name": "p", "kind": "simulated"}]})

    assert response.status_code == 200, response.json()
    assert Queue.objects.count() == 4


@pytest.mark.django_db(transaction=True)
def test_an_apply_waits_for_a_held_row_only_so_long(operator, settings):
    settings.LAKESHORE_APPLY_LOCK_TIMEOUT = 0.2
    builders.queue("train", description="old")
    change = {"queues": [{"name": "train", "description": "new"}]}
    holder = other_session()
    with holder.transaction():  # a request elsewhere holds the queue's row
        holder.execute("SELECT 1 FROM queues_queue WHERE name = 'train' FOR UPDATE")
        response = apply(operator, change)
    holder.close()

    error = assert_error(response, 503, "busy", says="LAKESHORE_APPLY_LOCK_TIMEOUT")
    assert response["Retry-After"] == "1"
    assert "changed nothing" in error["message"]
    assert Queue.objects.get(name="train").description == "old"
    # control: the row free, the same apply applies
    assert apply(operator, change).status_code == 200
    assert Queue.objects.get(name="train").description == "new"
