"""Issue 17, "Check the token before the body", measured on a real server: `make run`'s
gunicorn (lakeshore_admin/gunicorn_conf.py: 2 workers × 128 threads) against the test
database. 16 requests at once, each with a bad token and a 10 MiB body built to cost
the most memory once parsed, raise the server's resident memory (the master's and
workers' RSS together, sampled every 10 ms) by less than 50 MiB: on the lean path
(JSON), on the full path (JSON, LAKESHORE_LEAN_PATH=0) and on the SDK's poll
(msgpack).

The negative controls serve the order before issue 17 (tests/edge/parse_first.py:
the body parsed, then the token checked), with issue 29's count of a body's values
raised out of the way, and see the memory grow far more. The
msgpack control sends 2 MiB bodies: 16 × 10 MiB would take about 12 GiB of a shared
machine. Run with -s for the figures."""

import contextlib
import statistics
import threading
import time

import httpx
import psutil
import pytest

from tests.edge.test_token_before_body import json_bomb, msgpack_bomb
from tests.support.servers import environment, gunicorn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("memory"),  # one at a time: a control takes 2-4 GiB
    pytest.mark.security,
]

MIB = 1024 * 1024
AT_ONCE = 16
BOUND_MIB = 50
CLAIM = "/api/v1/daemons/1/claim/"  # a bad token is refused before any daemon is looked up
POLL = "/v1/daemon/poll"
JSON, MSGPACK = "application/json", "application/x-msgpack"
CONTROL = "tests.edge.parse_first"

# kind → (LAKESHORE_LEAN_PATH, route, content type, bomb, the control's application, the
# control's bomb size: half the test's for JSON, still far past the bound, in half the time)
KINDS = {
    "lean JSON": ("1", CLAIM, JSON, json_bomb, f"{CONTROL}:lean", 5 * MIB),
    "full JSON": ("0", CLAIM, JSON, json_bomb, f"{CONTROL}:before_django", 5 * MIB),
    "SDK msgpack": ("1", POLL, MSGPACK, msgpack_bomb, f"{CONTROL}:before_django", 2 * MIB),
}


def server_rss(proc) -> int:
    """The gunicorn master's and its workers' resident memory together, in bytes."""
    total = 0
    with contextlib.suppress(psutil.NoSuchProcess):
        master = psutil.Process(proc.pid)
        for process in (master, *master.children(recursive=True)):
            with contextlib.suppress(psutil.NoSuchProcess):  # a worker being replaced
                total += process.memory_info().rss
    return total


class Sampler:
    """The server's RSS every 10 ms in a thread; `peak` is the largest seen."""

    def __init__(self, proc):
        self.proc, self.peak, self._stop = proc, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, server_rss(self.proc))
            time.sleep(0.01)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        time.sleep(0.5)  # what the server frees late (the last answers) still counts
        self._stop.set()
        self._thread.join()


def at_once(base: str, path: str, content_type: str, body: bytes) -> list[tuple[int, str]]:
    """AT_ONCE requests with a bad token, each on its own connection, sent together:
    their (status, error code)."""
    barrier = threading.Barrier(AT_ONCE)
    answers: list[tuple[int, str]] = []
    lock = threading.Lock()
    headers = {"Authorization": "Bearer x", "Content-Type": content_type}

    def one():
        with httpx.Client(base_url=base, timeout=120) as client:
            barrier.wait()
            response = client.post(path, content=body, headers=headers)
        code = ""
        if response.headers.get("content-type", "").startswith("application/json"):
            code = response.json()["error"]["code"]
        with lock:
            answers.append((response.status_code, code))

    threads = [threading.Thread(target=one) for _ in range(AT_ONCE)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def measure(tmp_path, kind: str, *, control: bool) -> float:
    """MiB the server's RSS rose by under AT_ONCE bad-token requests with a bomb."""
    lean, path, content_type, bomb, control_app, control_size = KINDS[kind]
    env = environment(tmp_path, LAKESHORE_DB_POOL_MAX="12", LAKESHORE_LEAN_PATH=lean)
    if control:  # the parse it serves first is not cut short by the count of values either
        env["LAKESHORE_JSON_MAX_VALUES"] = str(10**9)
    body = bomb(control_size if control else 10 * MIB)
    with gunicorn(tmp_path, env, app=control_app if control else None) as (base, proc):
        for _ in range(2):  # warm: every thread, connection and code path in both workers
            at_once(base, path, content_type, bomb(64 * 1024))
        time.sleep(0.5)
        baseline = statistics.median(server_rss(proc) for _ in range(20))
        with Sampler(proc) as sampler:
            started = time.perf_counter()
            answers = at_once(base, path, content_type, body)
            seconds = time.perf_counter() - started
    statuses = {status for status, _ in answers}
    assert statuses <= {401, 429}, answers
    if content_type == JSON:
        assert {code for _, code in answers} <= {"authentication_failed", "throttled"}
    rise = (sampler.peak - baseline) / MIB
    order = "control: parse, then token" if control else "token first"
    print(
        f"\n{kind:12} {order:27} {AT_ONCE} × {len(body) / MIB:.0f} MiB, bad token: "
        f"RSS {baseline / MIB:.0f} MiB → peak {sampler.peak / MIB:.0f} MiB "
        f"(+{rise:.1f} MiB), answered {sorted(statuses)} in {seconds:.1f} s"
    )
    return rise


@pytest.mark.parametrize("kind", list(KINDS))
def test_16_bad_token_bombs_at_once_raise_the_servers_memory_less_than_50_mib(tmp_path, kind):
    assert measure(tmp_path, kind, control=False) < BOUND_MIB


@pytest.mark.parametrize("kind", list(KINDS))
def test_control_parsing_before_the_token_raises_it_far_more(tmp_path, kind):
    assert measure(tmp_path, kind, control=True) > 10 * BOUND_MIB
