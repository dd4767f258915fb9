"""Issue 17: a claim's answer is bounded by bytes. Its invocations' arguments (args and
kwargs as JSON text, the SDK's args_blob) add up to at most LAKESHORE_CLAIM_MAX_BYTES,
except that an answer always holds one invocation, whatever it weighs. What does not
fit stays queued: never marked running, attempts untouched.

The rule, with 5 queued invocations of 6 MiB of arguments each and the default 16 MiB:
6 + 6 = 12 MiB fits, 6 + 6 + 6 = 18 MiB does not, so a claim of limit 5 holds 2.
The negative controls raise the limit past everything (the rule before issue 17)."""

import json

import pytest
from django.db import connection
from rest_framework.test import APIClient

from fleet import protocol
from jobs import services
from jobs.claim_room import claim_bytes
from jobs.models import Invocation, Wire
from queues.models import QueueKind
from tests.support import builders

pytestmark = [pytest.mark.django_db, pytest.mark.security]

MiB = 1024 * 1024
SIX = 6 * MiB
UNBOUNDED = 1 << 50  # the rule before issue 17: no bound but the limit


@pytest.fixture(autouse=True)
def sixteen_mib(settings):
    settings.LAKESHORE_CLAIM_MAX_BYTES = 16 * MiB
    yield
    protocol.forget_queue_rows()


def _queued(queue: str, n: int, *, size: int = SIX, wire: str = Wire.JSON, priority=0):
    """n queued invocations whose arguments weigh `size` bytes (as JSON text
    '["xx…x"]' with kwargs '{}', or as an SDK blob with '[]' and '{}'), built in the
    database: the test process never holds them."""
    sdk = wire != Wire.JSON
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO jobs_invocation (queue, function, args, kwargs, priority, state,
                   attempts, max_attempts, key, reason, error, created_at, wire, args_blob,
                   run_config)
               SELECT %(queue)s, 'm.f',
                      CASE WHEN %(sdk)s THEN '[]'::jsonb
                           ELSE jsonb_build_array(repeat('x', %(size)s - 6)) END,
                      '{}', %(priority)s, 'queued', 0, 1, '', '', '', now(), %(wire)s,
                      CASE WHEN %(sdk)s THEN convert_to(repeat('b', %(size)s - 4), 'UTF8')
                      END,
                      '{}'
                 FROM generate_series(1, %(n)s)
            RETURNING id""",
            {"queue": queue, "n": n, "size": size, "wire": wire, "sdk": sdk, "priority": priority},
        )
        return sorted(row[0] for row in cursor.fetchall())


def _daemon(*queues):
    return builders.daemon(queues=list(queues))


def _still_queued(ids) -> bool:
    rows = Invocation.objects.filter(pk__in=ids).values_list("state", "attempts", "daemon_id")
    return sorted(rows) == [("queued", 0, None)] * len(ids)


def test_a_claim_of_five_6_mib_invocations_holds_two_and_the_rest_stay_queued():
    builders.queue(name="big")
    ids = _queued("big", 5)
    claimed = builders.claim(daemon=_daemon("big"), limit=5)

    assert [inv.pk for inv in claimed] == ids[:2]  # oldest first, as ever
    assert [claim_bytes(inv) for inv in claimed] == [SIX, SIX]
    assert all(inv.state == "running" for inv in claimed)
    assert _still_queued(ids[2:])


def test_negative_control_without_the_bound_all_five_come_back(settings):
    settings.LAKESHORE_CLAIM_MAX_BYTES = UNBOUNDED
    builders.queue(name="big")
    ids = _queued("big", 5)
    claimed = builders.claim(daemon=_daemon("big"), limit=5)
    assert [inv.pk for inv in claimed] == ids
    assert sum(claim_bytes(inv) for inv in claimed) == 5 * SIX  # 30 MiB in one answer


def test_an_invocation_bigger_than_the_bound_is_still_claimed_alone(settings):
    settings.LAKESHORE_CLAIM_MAX_BYTES = 4 * MiB
    builders.queue(name="big")
    ids = _queued("big", 3)
    daemon = _daemon("big")
    assert [inv.pk for inv in builders.claim(daemon=daemon, limit=5)] == ids[:1]
    assert [inv.pk for inv in builders.claim(daemon=daemon, limit=5)] == ids[1:2]
    assert _still_queued(ids[2:])


def test_the_sdk_wire_is_bounded_by_its_blobs():
    builders.queue(name="sdk")
    ids = _queued("sdk", 5, wire=Wire.ENVELOPE)
    claimed = builders.claim(daemon=_daemon("sdk"), limit=5, wires=[Wire.ENVELOPE, Wire.VALUE])
    assert [inv.pk for inv in claimed] == ids[:2]
    assert [len(inv.args_blob) for inv in claimed] == [SIX - 4] * 2
    assert _still_queued(ids[2:])


def test_negative_control_the_sdk_wire_without_the_bound(settings):
    settings.LAKESHORE_CLAIM_MAX_BYTES = UNBOUNDED
    builders.queue(name="sdk")
    ids = _queued("sdk", 5, wire=Wire.ENVELOPE)
    claimed = builders.claim(daemon=_daemon("sdk"), limit=5, wires=[Wire.ENVELOPE])
    assert [inv.pk for inv in claimed] == ids


def test_the_bound_holds_across_a_daemons_queues():
    builders.queue(name="a")
    builders.queue(name="b")
    in_a, in_b = _queued("a", 1), _queued("b", 4)
    claimed = builders.claim(daemon=_daemon("a", "b"), limit=5)
    assert [inv.pk for inv in claimed] == in_a + in_b[:1]
    assert _still_queued(in_b[1:])


def test_the_bound_holds_across_a_boltzmann_queues_levels():
    builders.queue(name="bz", kind=QueueKind.BOLTZMANN, temperature=1.0)
    ids = [i for level in (1, 2, 3) for i in _queued("bz", 2, priority=level)]
    claimed = builders.claim(daemon=_daemon("bz"), limit=5)
    assert len(claimed) == 2
    assert _still_queued(sorted(set(ids) - {inv.pk for inv in claimed}))


def test_the_bound_holds_in_priority_order():
    builders.queue(name="pq", kind=QueueKind.PRIORITY)
    low, high = _queued("pq", 2, priority=1), _queued("pq", 3, priority=9)
    claimed = builders.claim(daemon=_daemon("pq"), limit=5)
    assert [inv.pk for inv in claimed] == high[:2]
    assert _still_queued(low + high[2:])


def test_small_invocations_are_not_held_back():
    builders.queue(name="small")
    for i in range(100):
        services.invocation_submit(function="m.f", queue="small", args=[i], kwargs={"k": "é"})
    assert len(builders.claim(daemon=_daemon("small"), limit=100)) == 100


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ([], {}),
        ([1, 2.5, None, True], {"a": [1, {"b": "c"}]}),
        (["é", "日本", "\u2028", 'q"\\'], {"ünï": {"x": -0.0001, "y": 1e20}}),
    ],
)
def test_python_weighs_arguments_as_the_claim_statement_does(args, kwargs):
    inv, _ = services.invocation_submit(function="m.f", queue="", args=args, kwargs=kwargs)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT octet_length(args::text) + octet_length(kwargs::text) FROM jobs_invocation"
            " WHERE id = %s",
            [inv.pk],
        )
        assert claim_bytes(Invocation.objects.get(pk=inv.pk)) == cursor.fetchone()[0]


# ---------------------------------------------------------------------------- HTTP


@pytest.fixture
def operator():
    """An operator token, which may act for any daemon."""
    client = APIClient()
    client.credentials(**builders.auth(builders.token("operator")))
    return client


def test_the_claim_endpoint_answers_within_the_bound(operator):
    builders.queue(name="big")
    ids = _queued("big", 5)
    daemon = _daemon("big")
    response = operator.post(f"/api/v1/daemons/{daemon.pk}/claim/", {"limit": 5}, format="json")
    assert response.status_code == 200
    assert [item["id"] for item in response.json()] == [str(i) for i in ids[:2]]
    assert len(response.content) < 16 * MiB
    assert _still_queued(ids[2:])


def test_the_exchange_endpoint_answers_within_the_bound(operator):
    builders.queue(name="big")
    ids = _queued("big", 6)
    daemon = _daemon("big")
    (first,) = builders.claim(daemon=daemon, limit=1)
    body = {
        "outcomes": [{"invocation": first.pk, "attempt": 1, "state": "succeeded", "result": 1}],
        "limit": 5,
    }
    response = operator.post(f"/api/v1/daemons/{daemon.pk}/exchange/", body, format="json")
    assert response.status_code == 200
    answer = response.json()
    assert [item["state"] for item in answer["recorded"]] == ["succeeded"]
    assert [item["id"] for item in answer["claimed"]] == [str(i) for i in ids[1:3]]
    assert len(response.content) < 16 * MiB
    assert _still_queued(ids[3:])


def test_negative_control_the_claim_endpoint_without_the_bound(operator, settings):
    settings.LAKESHORE_CLAIM_MAX_BYTES = UNBOUNDED
    builders.queue(name="big")
    ids = _queued("big", 5)
    daemon = _daemon("big")
    response = operator.post(f"/api/v1/daemons/{daemon.pk}/claim/", {"limit": 5}, format="json")
    assert [item["id"] for item in json.loads(response.content)] == [str(i) for i in ids]
    assert len(response.content) > 5 * SIX
