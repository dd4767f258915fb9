import threading

import pytest
from django.db import connection

from queues import controller
from queues.models import Daemon, QueueEvent
from tests import builders

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_ticks_at_once_never_launch_twice():
    builders.provider(name="sim", kind="simulated")
    queue = builders.queue(
        name="train", provider="sim", elasticity_spec={"kind": "fixed", "min": 3}
    )
    for _ in range(10):
        barrier = threading.Barrier(4)

        def tick(barrier=barrier):
            try:
                barrier.wait()
                controller.tick_queue(queue.pk)
            finally:
                connection.close()

        threads = [threading.Thread(target=tick) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert Daemon.objects.live().subscribed_to("train").count() == 3
    assert sum(QueueEvent.objects.filter(action="scale_up").values_list("delta", flat=True)) == 3
