"""The order claims hand work out in. Every check compares the exact order claimed
(never sorted lists, which cannot see order), on data where each plausible wrong order
gives a different answer; the negative controls at the bottom run the same checks
against a deliberately wrong order and see them fail."""

import math
import random
from collections import Counter

import pytest

from fleet import protocol
from jobs import services
from jobs.models import Invocation
from queues import services as queue_services
from queues.models import QueueKind
from tests.support import builders

pytestmark = pytest.mark.django_db


def _submit(queue: str, priorities: list[int]) -> list[int]:
    ids = []
    for p in priorities:
        inv, _ = services.invocation_submit(
            function="lakeshore.functions.echo", queue=queue, priority=p, args=[p]
        )
        ids.append(inv.pk)
    return ids


def _drain(daemon, n: int, limit: int = 1, rng: random.Random | None = None) -> list[Invocation]:
    got: list[Invocation] = []
    while len(got) < n:
        batch = builders.claim(daemon=daemon, limit=limit, rng=rng)
        if not batch:
            break
        got += batch
    return got


# ---------------------------------------------------------------------------- the checks
# Each returns (the order claimed, the order it must be), both as invocation ids.

# kind: (priorities, in submit order; the claim order it must give, as submit indexes).
# Priorities and age disagree, and priority has ties at both ends, so oldest-first,
# newest-first, priority-then-oldest and priority-then-newest all differ.
ONE_AT_A_TIME = {
    QueueKind.FIFO: ([3, 1, 2, 9], [0, 1, 2, 3]),
    QueueKind.FILO: ([3, 1, 2, 9], [3, 2, 1, 0]),
    QueueKind.PRIORITY: ([1, 5, 3, 5, 1], [1, 3, 2, 0, 4]),
}

# A batch takes four of five: which four, and the order they come back in.
BATCH = {
    QueueKind.FIFO: ([3, 1, 2, 9, 0], [0, 1, 2, 3]),
    QueueKind.FILO: ([3, 1, 2, 9, 0], [4, 3, 2, 1]),
    QueueKind.PRIORITY: ([1, 5, 3, 5, 0], [1, 3, 2, 0]),
}


def _one_at_a_time(kind: str) -> tuple[list[int], list[int]]:
    priorities, expected = ONE_AT_A_TIME[kind]
    builders.queue(name="q", kind=kind)
    ids = _submit("q", priorities)
    daemon = builders.daemon(queues=["q"])
    return [i.pk for i in _drain(daemon, len(ids))], [ids[k] for k in expected]


def _batch(kind: str) -> tuple[list[int], list[int]]:
    priorities, expected = BATCH[kind]
    builders.queue(name="q", kind=kind)
    ids = _submit("q", priorities)
    daemon = builders.daemon(queues=["q"])
    batch = builders.claim(daemon=daemon, limit=len(expected))
    return [i.pk for i in batch], [ids[k] for k in expected]


def _daemon_queue_order(limit: int) -> tuple[list[int], list[int]]:
    builders.queue(name="first")
    builders.queue(name="second")
    second = _submit("second", [0, 0])  # older than `first`'s: id order would serve them first
    first = _submit("first", [0])
    daemon = builders.daemon(queues=["first", "second"])
    return [i.pk for i in _drain(daemon, 3, limit=limit)], first + second


def _cold_boltzmann() -> tuple[list[int], list[int]]:
    builders.queue(name="b", kind="boltzmann", temperature=0.01)
    ids = _submit("b", [0, 4, 2, 4, 1, 3])
    daemon = builders.daemon(queues=["b"])
    order = [i.pk for i in _drain(daemon, 6, rng=random.Random(5))]
    # highest priority first; within a level (the two 4s) oldest first
    return order, [ids[1], ids[3], ids[5], ids[2], ids[4], ids[0]]


BOLTZMANN_EACH_LEVEL = 400
BOLTZMANN_DRAWS = 200


def _boltzmann_share() -> int:
    """How many of BOLTZMANN_DRAWS claims (fixed seed) took priority 1 from equal
    backlogs at priorities 0 and 1, temperature 1."""
    builders.queue(name="b", kind="boltzmann", temperature=1.0)
    Invocation.objects.bulk_create(
        [
            Invocation(queue="b", function="x.y", priority=p)
            for p in (0, 1)
            for _ in range(BOLTZMANN_EACH_LEVEL)
        ]
    )
    daemon = builders.daemon(queues=["b"])
    rng = random.Random(99)
    picked = Counter()
    for _ in range(BOLTZMANN_DRAWS):
        (inv,) = builders.claim(daemon=daemon, limit=1, rng=rng)
        picked[inv.priority] += 1
    return picked[1]


def _likely_range(n0: int, n1: int, draws: int, temperature: float, tail: float = 5e-4):
    """The central range (all but `tail` at each end) of the exact distribution of how
    many of `draws` claims take priority 1, when each claim picks a level with
    probability ∝ count × exp(p / T) from what is left."""
    w1 = math.exp(1 / temperature)
    dist = [1.0]  # dist[k]: probability that k of the claims so far took priority 1
    for t in range(draws):
        after = [0.0] * (t + 2)
        for k, pk in enumerate(dist):
            left1, left0 = n1 - k, n0 - (t - k)
            p1 = left1 * w1 / (left1 * w1 + left0)
            after[k + 1] += pk * p1
            after[k] += pk * (1 - p1)
        dist = after
    cumulative, low = 0.0, None
    for k, pk in enumerate(dist):
        cumulative += pk
        if low is None and cumulative > tail:
            low = k
        if cumulative >= 1 - tail:
            return range(low, k + 1)
    return range(low, draws + 1)


# ---------------------------------------------------------------------------- order


def test_it_claims_fifo_oldest_first():
    claimed, expected = _one_at_a_time(QueueKind.FIFO)
    assert claimed == expected


def test_it_claims_filo_newest_first():
    claimed, expected = _one_at_a_time(QueueKind.FILO)
    assert claimed == expected


def test_it_claims_priority_highest_first_then_oldest():
    claimed, expected = _one_at_a_time(QueueKind.PRIORITY)
    assert claimed == expected


@pytest.mark.parametrize("kind", list(BATCH))
def test_it_claims_a_batch_in_the_same_order(kind):
    claimed, expected = _batch(kind)
    assert claimed == expected
    assert set(Invocation.objects.filter(state="running").values_list("id", flat=True)) == set(
        expected
    )
    assert Invocation.objects.filter(state="queued").count() == 1


def test_it_serves_the_default_queue_to_a_daemon_with_no_queues():
    builders.queue(name="named")
    (named,) = _submit("named", [0])
    (default,) = _submit("", [0])
    daemon = builders.daemon(queues=[])
    assert [i.pk for i in _drain(daemon, 5)] == [default]
    assert Invocation.objects.get(pk=named).state == "queued"


@pytest.mark.parametrize("limit", [1, 3])
def test_it_serves_queues_in_the_daemons_order(limit):
    claimed, expected = _daemon_queue_order(limit)
    assert claimed == expected


def test_it_dispatches_nothing_from_paused_or_archived_queues():
    builders.queue(name="held")
    (inv,) = _submit("held", [0])
    daemon = builders.daemon(queues=["held"])
    queue_services.queue_transition(name="held", action="pause")
    assert builders.claim(daemon=daemon) == []
    queue_services.queue_transition(name="held", action="archive")
    assert builders.claim(daemon=daemon) == []
    queue_services.queue_transition(name="held", action="resume")
    assert [i.pk for i in builders.claim(daemon=daemon)] == [inv]


def test_a_draining_queue_still_dispatches_what_it_admitted():
    builders.queue(name="d")
    (inv,) = _submit("d", [0])
    queue_services.queue_transition(name="d", action="drain")
    daemon = builders.daemon(queues=["d"])
    assert [i.pk for i in builders.claim(daemon=daemon)] == [inv]


# ---------------------------------------------------------------------------- boltzmann


def test_boltzmann_pick_matches_the_weights():
    """Each level is chosen with probability count × exp((p − p_max)/T) / Σ."""
    levels = {0: 50, 1: 30, 3: 20}
    temperature = 1.5
    rng = random.Random(1234)
    draws = 30_000
    seen = Counter(services.boltzmann_pick(levels, temperature, rng) for _ in range(draws))
    top = max(levels)
    weights = {p: n * math.exp((p - top) / temperature) for p, n in levels.items()}
    total = sum(weights.values())
    for level, weight in weights.items():
        expected = draws * weight / total
        sigma = math.sqrt(draws * (weight / total) * (1 - weight / total))
        assert abs(seen[level] - expected) < 4 * sigma, (level, seen[level], expected)


def test_boltzmann_never_starves_low_priorities():
    rng = random.Random(7)
    seen = Counter(services.boltzmann_pick({0: 1000, 5: 1}, 2.0, rng) for _ in range(5000))
    assert seen[0] > 0 and seen[5] > 0


def test_boltzmann_with_a_small_temperature_behaves_as_priority():
    claimed, expected = _cold_boltzmann()
    assert claimed == expected


def test_boltzmann_claims_follow_the_distribution_through_the_database():
    # With equal backlogs the first claim takes priority 1 with odds e : 1 (about 73 %),
    # drifting down as rows are taken; the range is exact for that process, not a guess.
    likely = _likely_range(BOLTZMANN_EACH_LEVEL, BOLTZMANN_EACH_LEVEL, BOLTZMANN_DRAWS, 1.0)
    assert _boltzmann_share() in likely, likely


# ---------------------------------------------------------------------------- negative controls
# The same checks, with the claim order deliberately wrong, must see it.


@pytest.mark.parametrize(
    "kind, wrong_as",
    [
        (QueueKind.FIFO, QueueKind.FILO),
        (QueueKind.FILO, QueueKind.FIFO),
        (QueueKind.PRIORITY, QueueKind.FIFO),
        (QueueKind.PRIORITY, QueueKind.FILO),
    ],
)
def test_the_order_checks_see_a_queue_claimed_in_another_kinds_order(monkeypatch, kind, wrong_as):
    monkeypatch.setitem(protocol._ORDER, kind, protocol._ORDER[wrong_as])
    claimed, expected = _one_at_a_time(kind)
    assert sorted(claimed) == sorted(expected)  # the same rows: only the order is wrong
    assert claimed != expected


@pytest.mark.parametrize("kind", list(BATCH))
def test_the_batch_check_sees_the_right_rows_in_the_wrong_order(monkeypatch, kind):
    """What a sorted() comparison let through: the right batch, handed back reversed."""
    claim = builders.claim
    monkeypatch.setattr(builders, "claim", lambda **kw: list(reversed(claim(**kw))))
    claimed, expected = _batch(kind)
    assert sorted(claimed) == sorted(expected)
    assert claimed != expected


@pytest.mark.parametrize("limit", [1, 3])
def test_the_queue_order_check_sees_the_daemons_queues_served_backwards(monkeypatch, limit):
    queues_of = protocol._queues_of
    monkeypatch.setattr(protocol, "_queues_of", lambda names: queues_of(names)[::-1])
    claimed, expected = _daemon_queue_order(limit)
    assert claimed != expected


def test_the_cold_boltzmann_check_sees_the_lowest_level_picked_first(monkeypatch):
    monkeypatch.setattr(protocol, "boltzmann_pick", lambda levels, temperature, rng: min(levels))
    claimed, expected = _cold_boltzmann()
    assert claimed != expected


_REAL_PICK = services.boltzmann_pick


@pytest.mark.parametrize(
    "wrong_pick",
    [
        pytest.param(lambda levels, temperature, rng: rng.choice(sorted(levels)), id="uniform"),
        pytest.param(lambda levels, temperature, rng: max(levels), id="strict-priority"),
        pytest.param(
            lambda levels, temperature, rng: _REAL_PICK(levels, -temperature, rng),
            id="inverted-weights",
        ),
    ],
)
def test_the_distribution_check_sees_a_pick_that_ignores_the_weights(monkeypatch, wrong_pick):
    monkeypatch.setattr(protocol, "boltzmann_pick", wrong_pick)
    likely = _likely_range(BOLTZMANN_EACH_LEVEL, BOLTZMANN_EACH_LEVEL, BOLTZMANN_DRAWS, 1.0)
    assert _boltzmann_share() not in likely
