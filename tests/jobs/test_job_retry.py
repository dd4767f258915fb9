"""Retry: an ended invocation (failed, timeout, killed) is queued again as a new
invocation linked to it, once, through one service (API, CLI, console)."""

import threading

import pytest
from django.db import connection

from jobs import services
from jobs.models import Invocation
from lakeshore_admin import hooks
from queues import services as queue_services
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

ECHO = "lakeshore.functions.echo"


def _ended(state: str, **fields) -> Invocation:
    inv, _ = services.invocation_submit(
        function=ECHO, queue=fields.pop("queue", "gpu"), args=[1, {"a": 2}], kwargs={"k": "v"},
        priority=5, timeout_s=30, max_attempts=2, key="first-run",
    )  # fmt: skip
    Invocation.objects.filter(pk=inv.pk).update(
        state=state, attempts=2, error="Traceback …\nValueError: bad input", **fields
    )
    inv.refresh_from_db()
    return inv


@pytest.fixture
def gpu():
    return builders.queue(name="gpu", kind="priority")


@pytest.mark.parametrize("state", ["failed", "timeout", "killed"])
def test_an_ended_invocation_is_queued_again_as_a_new_one_linked_to_it(operator, gpu, state):
    old = _ended(state)
    response = operator.post(f"/api/v1/jobs/{old.pk}/retry/")
    assert response.status_code == 201, response.content
    new = response.json()
    assert new["id"] != str(old.pk) and new["retry_of"] == str(old.pk)
    assert new["state"] == "queued" and new["attempts"] == 0 and new["max_attempts"] == 2
    assert (new["function"], new["queue"], new["args"], new["kwargs"]) == (
        ECHO, "gpu", [1, {"a": 2}], {"k": "v"},
    )  # fmt: skip
    assert (new["priority"], new["timeout_s"], new["key"]) == (5, 30, "")
    old.refresh_from_db()
    assert old.state == state and old.error.endswith("bad input")  # its record is kept
    shown = operator.get(f"/api/v1/jobs/{old.pk}/").json()
    assert shown["retried_as"] == new["id"] and shown["retry_of"] is None


@pytest.mark.parametrize("state", ["queued", "running", "succeeded"])
def test_only_an_ended_badly_invocation_can_be_retried(operator, gpu, state):
    old = _ended(state)
    before = Invocation.objects.count()
    assert_error(
        operator.post(f"/api/v1/jobs/{old.pk}/retry/"), 409, "invocation_not_retryable",
        says=state,
    )  # fmt: skip
    assert Invocation.objects.count() == before


def test_a_second_retry_names_the_first_and_queues_nothing(operator, gpu):
    old = _ended("failed")
    first = operator.post(f"/api/v1/jobs/{old.pk}/retry/").json()["id"]
    again = assert_error(
        operator.post(f"/api/v1/jobs/{old.pk}/retry/"), 409, "already_retried", says=first
    )
    assert again["retry"] == first
    assert Invocation.objects.filter(retry_of=old).count() == 1


def test_retry_needs_the_operator_role_and_an_existing_invocation(operator, viewer, gpu):
    old = _ended("failed")
    assert viewer.post(f"/api/v1/jobs/{old.pk}/retry/").status_code == 403
    assert_error(operator.post("/api/v1/jobs/999999/retry/"), 404, "not_found", says="999999")


def test_a_retry_is_admitted_like_a_submit(operator, gpu):
    old = _ended("failed")
    queue_services.queue_transition(name="gpu", action="drain")
    response = operator.post(f"/api/v1/jobs/{old.pk}/retry/")
    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "queue_not_admitting"
    assert not Invocation.objects.filter(retry_of=old).exists()


@pytest.mark.django_db(transaction=True)
def test_a_retry_that_comes_while_another_is_inserting_waits_and_is_refused():
    """The second retry arrives after the first checked and before it inserted: it waits
    for the first one's row lock, then sees its retry."""
    builders.queue(name="gpu")
    old = _ended("failed")
    outcomes = {}

    def retry(name):
        try:
            outcomes[name] = services.invocation_retry(invocation_id=old.pk).pk
        except Exception as exc:  # noqa: BLE001 - the loser's refusal is asserted
            outcomes[name] = getattr(exc, "code", repr(exc))
        finally:
            connection.close()

    second = threading.Thread(target=retry, args=("second",))

    def let_the_second_in():
        hooks.clear("retry.before_insert")  # the second passes this point freely
        second.start()
        second.join(1.0)  # it waits on our lock (without the lock it would insert now)

    hooks.register("retry.before_insert", let_the_second_in)
    try:
        retry("first")
    finally:
        hooks.clear("retry.before_insert")
    second.join(10)
    assert isinstance(outcomes["first"], int) and outcomes["second"] == "already_retried"
    assert Invocation.objects.filter(retry_of=old).count() == 1
