"""One rule for the queues whose daemons the controller starts: the controller's
queryset (fleet/controller.py, which a wake uses) and the SQL a submit asks
(jobs/serving.py) agree on every combination of provider, elasticity and state."""

import itertools

import pytest

from fleet.controller import managed, starting
from jobs import serving
from queues.models import QueueState
from queues.services import queue_transition
from tests import builders

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


def test_the_controller_and_a_submit_agree_on_the_queues_the_controller_starts(
    every_kind_of_queue,
):
    names = every_kind_of_queue
    ours = set(starting().values_list("name", flat=True))
    assert ours == {"pe-active", "pe-paused", "pe-draining"}
    assert _submit_says_it_starts(names) == ours
    assert ours <= set(managed().values_list("name", flat=True))


def test_negative_control_a_rule_that_forgets_archived_queues_disagrees(
    every_kind_of_queue, monkeypatch
):
    forgetful = serving._STARTS.replace(" AND sq.state <> %(serving_archived)s::text", "")
    assert forgetful != serving._STARTS
    monkeypatch.setattr(serving, "_STARTS", forgetful)
    ours = set(starting().values_list("name", flat=True))
    assert _submit_says_it_starts(every_kind_of_queue) == ours | {"pe-archived"}


def test_an_archived_queue_is_managed_only_while_its_provider_runs_daemons_for_it(
    every_kind_of_queue,
):
    assert "pe-archived" not in set(managed().values_list("name", flat=True))
    builders.daemon(queues=["pe-archived"], provider=builders.provider(name="sim2"))
    assert "pe-archived" in set(managed().values_list("name", flat=True))
    builders.daemon(queues=["nn-archived"])  # self-registered: not the provider's
    assert "nn-archived" not in set(managed().values_list("name", flat=True))
