"""Which queues the controller looks after (fleet/controller.managed) and whose daemons
it starts (queues.models.STARTS_DAEMONS_SQL, one rule): a submit (its SQL,
jobs/serving.py) and the controller's wake see the same queues, on every combination
of provider, elasticity and state, and as a queue changes."""

import itertools

import pytest

from fleet import controller
from fleet.controller import managed
from jobs import serving
from queues.models import Queue, QueueState
from queues.services import queue_patch, queue_transition
from tests.support import builders

pytestmark = pytest.mark.django_db

ACTIONS = {
    QueueState.ACTIVE: None,
    QueueState.PAUSED: "pause",
    QueueState.DRAINING: "drain",
    QueueState.ARCHIVED: "archive",
}


@pytest.fixture
def every_kind_of_queue() -> list[str]:
    """A queue for each of provider or not × elasticity or not × each state."""
    builders.provider(name="sim", kind="simulated")
    names = []
    for provider, elastic, state in itertools.product((True, False), (True, False), ACTIONS):
        name = f"{'p' if provider else 'n'}{'e' if elastic else 'n'}-{state}"
        builders.queue(
            name=name,
            provider="sim" if provider else None,
            elasticity_spec={"kind": "fixed", "min": 1} if elastic else None,
        )
        if ACTIONS[state]:
            queue_transition(name=name, action=ACTIONS[state])
        names.append(name)
    return names


def _submit_says_it_starts(names: list[str]) -> set[str]:
    return {name for name, seen in serving.of_queues(names).items() if seen.starts}


def _the_controller_starts() -> set[str]:
    return set(Queue.objects.starting_daemons().values_list("name", flat=True))


def test_the_controller_and_a_submit_agree_on_the_queues_the_controller_starts(
    every_kind_of_queue,
):
    names = every_kind_of_queue
    ours = _the_controller_starts()
    assert ours == {"pe-active", "pe-paused", "pe-draining"}
    assert _submit_says_it_starts(names) == ours
    assert ours <= set(managed().values_list("name", flat=True))


def test_the_rule_follows_a_queue_as_it_changes():
    builders.provider(name="sim", kind="simulated")
    builders.queue(name="train", elasticity_spec={"kind": "fixed", "min": 1})
    assert _submit_says_it_starts(["train"]) == _the_controller_starts() == set()
    assert controller.wake("train") is None
    queue_patch(name="train", changes={"provider": "sim"})
    assert _submit_says_it_starts(["train"]) == _the_controller_starts() == {"train"}
    assert controller.wake("train").action == "scale_up"
    queue_transition(name="train", action="archive")
    assert _submit_says_it_starts(["train"]) == _the_controller_starts() == set()
    assert controller.wake("train") is None


def test_an_archived_queue_is_managed_only_while_its_provider_runs_daemons_for_it(
    every_kind_of_queue,
):
    assert "pe-archived" not in set(managed().values_list("name", flat=True))
    builders.daemon(queues=["pe-archived"], provider=builders.provider(name="sim2"))
    assert "pe-archived" in set(managed().values_list("name", flat=True))
    builders.daemon(queues=["nn-archived"])  # self-registered: not the provider's
    assert "nn-archived" not in set(managed().values_list("name", flat=True))
