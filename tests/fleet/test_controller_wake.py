"""A submit into an elastic queue that no live daemon serves wakes the controller for that
queue (issue 20: scale from zero without waiting for a tick); a wake and a tick that race
launch once. The real chain (gunicorn, a Celery worker, real daemons): tests/fleet/test_wake.py."""

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.test import APIClient

from accounts.roles import grant
from fleet import controller, tasks
from jobs import services
from lakeshore_admin import hooks
from lakeshore_admin.celery import app as celery_app
from queues.models import QueueEvent
from tests.support import builders

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "lakeshore.functions.echo"


@pytest.fixture
def wakes(monkeypatch):
    """The wakes submits send to the Celery worker (the broker is the boundary)."""
    sent: list[str] = []
    monkeypatch.setattr(tasks, "_sent", {})
    monkeypatch.setattr(
        celery_app, "send_task", lambda name, args, *rest, **kw: sent.append((name, *args))
    )
    return sent


def _elastic(name="train", provider_kind="simulated", minimum=0):
    provider = builders.provider(name=f"{name}-p", kind=provider_kind)
    return builders.queue(
        name=name,
        provider=provider.name,
        elasticity_spec={"kind": "fully_elastic", "min": minimum, "max": 4},
    )


def test_a_submit_into_an_elastic_queue_with_no_daemon_wakes_the_controller(wakes):
    queue = _elastic()
    invocation, _ = services.invocation_submit(function=ECHO, queue="train")
    assert wakes == [("fleet.wake", "train")]
    assert invocation.hint == ""  # its provider starts a daemon: nothing to tell

    event = controller.wake("train")
    assert (event.action, event.delta) == ("scale_up", 1)
    assert event.reason.startswith("woken by a submit: ")
    assert list(QueueEvent.objects.filter(queue=queue).values_list("action", flat=True)) == [
        "scale_up"
    ]
    # served now (the daemon it launched is provisioning): the next submit sends none
    services.invocation_submit(function=ECHO, queue="train")
    assert wakes == [("fleet.wake", "train")]
    assert controller.wake("train") is None


def test_a_batch_wakes_each_unserved_elastic_queue_once(wakes):
    _elastic("a")
    _elastic("b")
    builders.daemon(queues=["b"])
    services.invocation_submit_batch(
        [{"function": ECHO, "queue": "a"} for _ in range(3)] + [{"function": ECHO, "queue": "b"}]
    )
    assert wakes == [("fleet.wake", "a")]


def test_no_wake_for_a_served_queue_a_queue_without_provider_or_the_default_queue(wakes):
    _elastic("served")
    builders.daemon(queues=["served"])
    builders.queue(name="plain")
    builders.provider(name="idle-p")
    builders.queue(name="no-elasticity", provider="idle-p")
    for name in ("served", "plain", "no-elasticity", ""):
        services.invocation_submit(function=ECHO, queue=name)
    assert wakes == []
    assert controller.wake("plain") is None and controller.wake("no-elasticity") is None


def test_a_wake_racing_a_tick_launches_once():
    """The tick holds the queue (its transaction open, its launch made) when the wake
    comes: the wake decides nothing. Then the wake that comes after the tick committed
    sees the daemon it launched."""
    queue = _elastic()
    services.invocation_submit(function=ECHO, queue="train")
    woken: list = []

    def wake_meanwhile():
        def run():
            woken.append(controller.wake("train"))
            connection.close()

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(30)

    hooks.register("tick.acted", wake_meanwhile)
    try:
        ticked = builders.tick_queue(queue.pk)
    finally:
        hooks.clear("tick.acted")
    assert woken == [None]
    assert (ticked.action, ticked.delta) == ("scale_up", 1)
    assert controller.wake("train") is None  # after the tick: served by its daemon
    assert queue.events.filter(action="scale_up").count() == 1
    assert sum(queue.events.values_list("delta", flat=True)) == 1


def test_a_tick_after_a_wake_launches_nothing_more():
    queue = _elastic()
    services.invocation_submit(function=ECHO, queue="train")
    assert controller.wake("train").delta == 1
    after = builders.tick_queue(queue.pk)
    assert after.delta == 0 and not after.reason.startswith("woken")
    assert sum(queue.events.values_list("delta", flat=True)) == 1


def test_the_hint_names_the_command_that_starts_a_daemon():
    builders.queue(name="gpu")
    inv, _ = services.invocation_submit(function=ECHO, queue="gpu")
    assert "lakeshore daemon run --queues gpu" in inv.hint
    inv, _ = services.invocation_submit(function=ECHO)
    assert "the default queue" in inv.hint and "'lakeshore daemon run'" in inv.hint
    builders.daemon(queues=[])
    builders.daemon(queues=["gpu", "other"])
    assert services.invocation_submit(function=ECHO, queue="gpu")[0].hint == ""
    assert services.invocation_submit(function=ECHO)[0].hint == ""


def test_the_wake_shows_in_the_events_and_the_console_timeline(client):
    _elastic()
    services.invocation_submit(function=ECHO, queue="train")
    controller.wake("train")

    api = APIClient()
    api.credentials(**builders.auth(builders.token("viewer")))
    events = api.get("/api/v1/queues/train/events/?verbose=1").json()
    assert [e["reason"][:18] for e in events] == ["woken by a submit:"]

    user = get_user_model().objects.create_user("vera", password="pw-for-tests-only")
    grant(user, "viewer")
    client.force_login(user)
    for page in ("/queues/train/", "/events/"):
        assert "woken by a submit: " in client.get(page).content.decode(), page
