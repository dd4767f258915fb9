"""Two servers share one database, each with its Celery beat (issue 21): the
controller's tick runs once an interval, whichever beat fires (fleet/controller.beat_due).
The negative control: with no share of the interval required, both beats tick."""

import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from fleet import controller, tasks
from fleet.models import Beat
from queues.models import QueueEvent
from tests.support import builders

pytestmark = pytest.mark.django_db(transaction=True)


def _elastic_queue():
    builders.provider(name="sim", kind="simulated")
    builders.queue(name="e", provider="sim", elasticity_spec={"kind": "fixed", "min": 1})


def test_the_second_beat_within_the_interval_does_not_tick():
    _elastic_queue()
    first = tasks.tick()
    assert "beat" not in first
    events = QueueEvent.objects.count()
    assert tasks.tick() == {"beat": "another beat ticked within the interval"}
    assert QueueEvent.objects.count() == events  # it did nothing at all
    # an interval later, the next beat (either server's) ticks
    Beat.objects.filter(name="tick").update(
        at=timezone.now() - timedelta(seconds=settings.LAKESHORE_TICK_SECONDS)
    )
    assert "beat" not in tasks.tick()


def test_two_beats_at_the_same_moment_tick_once():
    now = timezone.now()
    answers, ready = [], threading.Barrier(2)

    def beat():
        ready.wait()
        answers.append(controller.beat_due("tick", now=now))
        connection.close()

    threads = [threading.Thread(target=beat) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers) == [False, True]


def test_control_without_the_share_both_beats_tick(monkeypatch):
    _elastic_queue()
    monkeypatch.setattr(controller, "BEAT_SHARE", -1.0)
    assert "beat" not in tasks.tick()
    assert "beat" not in tasks.tick()
