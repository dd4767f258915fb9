"""Issue 29, "Small JSON bodies cost hundreds of megabytes", performed against `make
run`'s server (gunicorn's uvicorn workers, 2 processes) on the test database. Each of
the issue's three bodies raises the server's resident memory (the master's and
workers' RSS together, sampled every 10 ms: test_token_before_body_server.Sampler) by
less than 100 MiB, and is answered in a few KiB:

- an operator's 0.57 MiB apply of 200,000 empty lists (was +396 MiB, a 25.7 MiB error):
  the document's list is longer than its bound, refused before an item is validated;
- a daemon token's 0.76 MiB registration with 150,000 queue names (was +304 MiB): the
  64-queue bound, checked before the names;
- a daemon's credential's 4 × 10 MiB claims at once on another daemon's id (was
  +819 MiB, then 403): 403 not_your_daemon, the bodies unread.

The controls: the same four claim bodies on the credential's own daemon are read and
parsed (each holds fewer values than LAKESHORE_JSON_MAX_VALUES) and raise the memory
far more, so the ownership check before the body is what stops them; and the legit
bodies pass (a plan of one queue, a registration with two, an empty claim, a
10,000-invocation batch submit). Run with -s for the figures."""

import json
import statistics
import threading
import time

import httpx
import pytest

from tests.edge.test_token_before_body_server import Sampler, server_rss
from tests.support import builders
from tests.support.servers import environment, gunicorn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("memory"),  # one at a time: the control takes about 1 GiB
    pytest.mark.security,
]

MIB = 1024 * 1024
BOUND_MIB = 100
ANSWER_MAX = 16 * 1024  # bytes: a refusal says what is wrong, not every item
ECHO = "lakeshore.functions.echo"


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_setup):
    """One server for the module (make run's: 2 workers), on the test database."""
    tmp_path = tmp_path_factory.mktemp("json-cost")
    with gunicorn(tmp_path, environment(tmp_path, LAKESHORE_DB_POOL_MAX="12")) as (base, proc):
        yield base, proc


def post(base: str, path: str, body: bytes, token: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with httpx.Client(base_url=base, timeout=120) as client:
        return client.post(path, content=body, headers=headers)


def at_once(base: str, path: str, body: bytes, token: str, count: int) -> list[httpx.Response]:
    """`count` requests, each on its own connection, sent together."""
    barrier = threading.Barrier(count)
    answers: list[httpx.Response] = []

    def one():
        barrier.wait()
        answers.append(post(base, path, body, token))

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def measured(proc, label: str, send) -> tuple[float, list[httpx.Response]]:
    """(MiB the server's RSS rose by while `send()` ran, its answers)."""
    time.sleep(0.5)
    baseline = statistics.median(server_rss(proc) for _ in range(20))
    with Sampler(proc) as sampler:
        answers = send()
    rise = (sampler.peak - baseline) / MIB
    sizes = sorted({len(answer.content) for answer in answers})
    print(
        f"\n{label}: RSS {baseline / MIB:.0f} MiB → peak {sampler.peak / MIB:.0f} MiB "
        f"(+{rise:.1f} MiB), answered {sorted({a.status_code for a in answers})}, "
        f"{sizes} bytes"
    )
    return rise, answers


def registered(base: str, bootstrap: str, name: str) -> tuple[int, str]:
    """A daemon registered through the server: (its id, its own credential)."""
    made = post(base, "/api/v1/daemons/register/", _json({"name": name, "queues": ["w"]}),
                bootstrap)  # fmt: skip
    assert made.status_code == 201, made.text
    return made.json()["id"], made.json()["token"]


def _json(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def fat_claim(size: int = 10 * MIB) -> bytes:
    """A claim body of `size` bytes holding fewer values than LAKESHORE_JSON_MAX_VALUES
    (500,000): objects of one member with a long key, about 280 bytes each once
    parsed. Its unknown field is refused, after the parse."""
    key = "k" * 36
    count = size // (len(key) + 8)
    return _json({"pad": [{f"{key}{i:06d}"[-len(key) :]: 0} for i in range(count)]})


def test_an_apply_of_empty_lists_is_refused_before_its_items(server):
    base, proc = server
    body = _json({"document": {"queues": [[]] * 200_000}, "dry_run": True})
    assert 0.5 * MIB < len(body) < 0.6 * MIB
    rise, answers = measured(
        proc,
        "apply, 200,000 empty lists",
        lambda: [post(base, "/api/v1/apply/", body, builders.token("operator"))],  # fmt: skip
    )
    (answer,) = answers
    assert answer.status_code == 400 and len(answer.content) < ANSWER_MAX
    assert answer.json()["error"]["code"] == "invalid"
    assert rise < BOUND_MIB


def test_a_registration_of_150000_queues_is_refused_before_its_names(server):
    base, proc = server
    builders.queue(name="w")
    body = _json({"name": "d", "queues": ["AB"] * 150_000})  # each name a bad one, too
    assert 0.7 * MIB < len(body) < 0.8 * MIB
    rise, answers = measured(
        proc,
        "register, 150,000 queues",
        lambda: [
            post(base, "/api/v1/daemons/register/", body, builders.token("daemon"))
        ],  # fmt: skip
    )
    (answer,) = answers
    assert answer.status_code == 400 and len(answer.content) < ANSWER_MAX
    error = answer.json()["error"]
    assert error["code"] == "invalid" and set(error["fields"]) == {"queues"}
    assert "64" in error["fields"]["queues"]
    assert rise < BOUND_MIB


def test_claims_on_another_daemons_id_are_refused_with_their_bodies_unread(server):
    base, proc = server
    builders.queue(name="w")
    bootstrap = builders.token("daemon")
    mine, credential = registered(base, bootstrap, "mine")
    other, _ = registered(base, bootstrap, "other")
    body = fat_claim()
    post(base, f"/api/v1/daemons/{other}/claim/", b"{}", credential)  # warm both workers
    post(base, f"/api/v1/daemons/{other}/claim/", b"{}", credential)
    rise, answers = measured(
        proc,
        "4 × 10 MiB claims, another daemon's id",
        lambda: at_once(base, f"/api/v1/daemons/{other}/claim/", body, credential, 4),
    )
    assert {a.status_code for a in answers} == {403}
    assert {a.json()["error"]["code"] for a in answers} == {"not_your_daemon"}
    assert rise < BOUND_MIB
    # the control: the same bodies on its own daemon's id are read and parsed (each is
    # within the body and value limits) and cost far more; then refused for the field
    rise, answers = measured(
        proc,
        "control: the same on its own id",
        lambda: at_once(base, f"/api/v1/daemons/{mine}/claim/", body, credential, 4),
    )
    assert {a.status_code for a in answers} == {400}
    assert {a.json()["error"]["code"] for a in answers} == {"invalid"}
    assert all(len(a.content) < ANSWER_MAX for a in answers)
    assert rise > BOUND_MIB  # measured: +293 MiB


def test_control_legit_bodies_pass(server):
    base, _ = server
    builders.queue(name="w")
    operator = builders.token("operator")
    plan = post(
        base, "/api/v1/apply/", _json({"document": {"queues": [{"name": "w"}]}, "dry_run": True}),
        operator,
    )  # fmt: skip
    assert plan.status_code == 200, plan.text
    mine, credential = registered(base, builders.token("daemon"), "legit")
    claim = post(base, f"/api/v1/daemons/{mine}/claim/", _json({"limit": 1}), credential)
    assert claim.status_code == 200 and claim.json() == []
    batch = [{"function": ECHO, "queue": "w", "args": [i, "x"], "kwargs": {"k": i}}
             for i in range(10_000)]  # fmt: skip
    submitted = post(base, "/api/v1/jobs/", _json(batch), operator)
    assert submitted.status_code == 201, submitted.text[:500]
    assert len(submitted.json()) == 10_000
