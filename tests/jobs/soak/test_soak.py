"""Soak: 10,000 invocations through 32 HTTP daemons while daemons crash, stall and are
dropped, the reaper hands their work back, and PostgreSQL restarts once mid-run.

The daemons speak to the production server: gunicorn (lakeshore_admin/gunicorn_conf.py,
two worker processes) in a subprocess on the test database, configured with the same
short heartbeat timeout as the reaper, which runs here as a thread. The restart is real
when this test runs in a pytest process of its own (`make test` runs `pytest -m soak`
after the rest); under pytest-xdist the server is shared, so its database is only cut
off for a while.

It passes when every invocation ended (nothing queued or running), each one that a
drop did not kill succeeded with exactly one accepted success, the only ones killed ran
on a dropped daemon at its drop, no two daemons held the same attempt, no invocation
ran on two daemons at overlapping times with both reports accepted (the fenced
completion refused the stale one), and no daemon row is left live but the current
threads'. Its figures (wall time, rate, requeues, chaos, restart) are shown in pytest's
terminal summary."""

import os
import random
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.db import InterfaceError, OperationalError, connection

from fleet.models import LIVE_DAEMON_STATES, Daemon
from jobs.models import Invocation
from tests.jobs.soak.chaos import Chaos, Reaper
from tests.jobs.soak.daemon_thread import CLAIM_LIMIT, QUEUE, SINGLE_EVERY, DaemonThread
from tests.jobs.soak.database_restart import restart_database
from tests.jobs.soak.http_calls import REFUSED
from tests.jobs.soak.ledger import Shared
from tests.jobs.soak.web_server import DB_POOL_MAX, HEARTBEAT_TIMEOUT, WEB_WORKERS, Server
from tests.support import builders
from tests.support.servers import database_url

pytestmark = [pytest.mark.slow, pytest.mark.soak, pytest.mark.django_db(transaction=True)]

FIGURES = "soak figures"  # the property tests/jobs/soak/conftest.py shows in the summary

INVOCATIONS = int(os.environ.get("LAKESHORE_SOAK_INVOCATIONS", "10000"))
BATCH = 1_000  # per POST /api/v1/jobs/
SUBMITTERS = 4  # batches in flight at once
DAEMONS = 32
MAX_ATTEMPTS = 20  # requeues never exhaust them
PROCESSING_LIMIT = max(130.0, INVOCATIONS / 20)  # s: bounded, whatever happens
# The chaos' and the daemons' choices (not their timing): printed, and settable to retry.
SEED = int(os.environ.get("LAKESHORE_SOAK_SEED") or random.randrange(1_000_000))  # noqa: S311


@pytest.fixture
def server(transactional_db, tmp_path):
    """gunicorn on the test database; stopped before the test's tables are flushed."""
    web = Server(tmp_path, database_url())
    web.start()
    try:
        yield web
    finally:
        web.stop()


def _submit(base_url: str, operator: str) -> None:
    """Batches of up to 1,000 (POST /api/v1/jobs/ with a list), a few at a time."""

    def batch(start: int) -> int:
        items = [
            {"function": "soak.work.run", "queue": QUEUE, "args": [n], "max_attempts": MAX_ATTEMPTS}
            for n in range(start, min(start + BATCH, INVOCATIONS))
        ]
        response = http.post("jobs/", json=items)
        assert response.status_code == 201, response.text
        return len(response.json())

    with (
        httpx.Client(
            base_url=base_url + "/api/v1/",
            headers={"Authorization": f"Bearer {operator}"},
            timeout=120,
        ) as http,
        ThreadPoolExecutor(max_workers=SUBMITTERS) as pool,
    ):
        assert sum(pool.map(batch, range(0, INVOCATIONS, BATCH))) == INVOCATIONS


def _open_work() -> int | None:
    """Invocations still queued or running (None while the database is away)."""
    try:
        return Invocation.objects.filter(queue=QUEUE, state__in=["queued", "running"]).count()
    except (OperationalError, InterfaceError):
        connection.close()
        return None


def _live_daemons() -> set[int] | None:
    """Ids of the daemon rows that are live (None while the database is away)."""
    try:
        return set(Daemon.objects.filter(state__in=LIVE_DAEMON_STATES).values_list("id", flat=True))
    except (OperationalError, InterfaceError):
        connection.close()
        return None


def _current_ids(daemons: list[DaemonThread]) -> set[int]:
    return {d.daemon_id for d in daemons if d.daemon_id is not None}


def _wait_live_equals_current(daemons, timeout: float, drops=()) -> tuple[set, set]:
    """The daemon rows left live must be exactly the current threads' (crashed ones'
    old rows get reaped within the heartbeat timeout), once every dropped thread has
    registered again (one dropped just before the end may still be on its way: between
    its 409 and its new registration it has no daemon, and the sets match early)."""
    deadline = time.monotonic() + timeout
    while True:
        before = _current_ids(daemons)
        live = _live_daemons()
        after = _current_ids(daemons)
        replaced = all(drop["worker"].ids[-1] != drop["daemon"] for drop in drops)
        if live is not None and before == after == live and replaced:
            return live, after
        if time.monotonic() > deadline:
            return live or set(), after
        time.sleep(0.25)


def test_soak_daemons_chaos_and_a_database_restart(server, settings, record_property):
    settings.LAKESHORE_HEARTBEAT_TIMEOUT = HEARTBEAT_TIMEOUT  # the reaper's; the server's too
    settings.LAKESHORE_RETRY_BACKOFF = 0
    began = time.monotonic()
    rng = random.Random(SEED)  # noqa: S311
    builders.queue(name=QUEUE)
    operator = builders.token("operator")
    tokens = [builders.token("daemon") for _ in range(DAEMONS)]
    connection.close()
    _submit(server.url, operator)
    figures = {"submit": time.monotonic() - began, "restart": "not reached", "restart_s": 0.0}

    shared = Shared(server.url)
    daemons = [DaemonThread(shared, i, tokens[i], rng.randrange(2**32)) for i in range(DAEMONS)]
    chaos = Chaos(shared, daemons, operator, rng.randrange(2**32))
    reaper = Reaper(shared)
    drained = joined = False
    restarted_at = None
    live_at_end: tuple[set, set] = (set(), set())
    try:
        reaper.start()
        for daemon in daemons:
            daemon.start()
        chaos.start()
        started, cpu = time.monotonic(), time.process_time()
        while time.monotonic() < started + PROCESSING_LIMIT and not shared.stop.is_set():
            if figures["restart"] == "not reached" and shared.ledger.succeeded >= INVOCATIONS // 3:
                restarted_at = time.monotonic()
                figures["restart"] = restart_database(settings)
                figures["restart_s"] = time.monotonic() - restarted_at
                figures["restart"] += f" at {restarted_at - started:.0f} s"
            if _open_work() == 0:
                drained = True
                break
            time.sleep(0.5)
        figures["processing"] = time.monotonic() - started
        figures["cpu"] = time.process_time() - cpu
        chaos.stop(timeout=30)
        if drained:
            live_at_end = _wait_live_equals_current(daemons, timeout=10, drops=chaos.drops)
        figures["live_check"] = time.monotonic() - started - figures["processing"]
    finally:
        shared.stop.set()  # the daemon threads deregister their current daemons
        chaos.stop(timeout=30)
        until = time.monotonic() + 20
        joined = all([daemon.join(timeout=until - time.monotonic()) for daemon in daemons])
        stopping = time.monotonic()
        reaper.stop(timeout=15)
        connection.close()
        server.stop()  # its CPU time is read here
        figures["server_stop"] = time.monotonic() - stopping
    figures["total"] = time.monotonic() - began
    if restarted_at is not None:
        first = shared.ledger.first_success_after(restarted_at + figures["restart_s"])
        figures["recovered_s"] = None if first is None else first - restarted_at

    rows = list(
        Invocation.objects.filter(queue=QUEUE).values_list(
            "id", "state", "attempts", "daemon_id", "reason"
        )
    )
    left_live = _live_daemons()
    connection.close()
    record_property(FIGURES, _figures(figures, rows, shared, chaos, server))

    assert not shared.errors, "\n".join(shared.errors[:5]) + "\n" + server.log_tail()
    assert drained, _leftover(shared.ledger, daemons)
    assert joined, "a daemon thread did not stop"
    _check_outcomes(rows, shared.ledger, chaos.drops)
    _check_fencing(shared.ledger)

    # the daemon rows: while the threads ran, the live ones were exactly theirs; every
    # dropped thread came back as a new daemon; at the end none is left live
    live, current = live_at_end
    assert live == current, f"live {sorted(live - current)}, threads' {sorted(current - live)}"
    for drop in chaos.drops:
        ids = drop["worker"].ids
        assert ids.index(drop["daemon"]) < len(ids) - 1, f"daemon {drop['daemon']} not replaced"
    assert left_live == set(), left_live
    assert shared.stats["crashes"] and chaos.drops, "the chaos thread did nothing"
    assert shared.stats["list reports"] and shared.stats["single reports"], "a report path unused"
    assert figures["restart"] != "not reached"


def _figures(figures: dict, rows: list, shared: Shared, chaos: Chaos, server: Server) -> str:
    """The run's figures, for the terminal summary (tests/jobs/soak/conftest.py)."""
    ledger, stats = shared.ledger, shared.stats.snapshot()
    took = figures.get("processing", 0.0) or 1e-9
    requests = sum(n for key, n in stats.items() if key.startswith("requests: ")) or 1
    answered = server.answers()
    served = sum(answered.values()) or 1
    killed = sum(1 for row in rows if row[1] == "killed")
    unseen = sum(  # succeeded, though its only report was refused whole on a retry
        1
        for inv, state, attempts, daemon, _ in rows
        if state == "succeeded"
        and not ledger.success_attempts.get(inv)
        and ledger.unknown.get((inv, attempts)) == daemon
    )
    overlaps, fenced = _overlaps(ledger)
    recovered = figures.get("recovered_s")
    lists = stats.get("list reports", 0)
    singles = sum(1 for i in range(DAEMONS) if i % SINGLE_EVERY == SINGLE_EVERY - 1)
    lines = [
        f"soak figures (seed {SEED}, {INVOCATIONS} invocations, {DAEMONS} daemons):",
        f"server                     gunicorn, {WEB_WORKERS} workers, pool {DB_POOL_MAX} each, "
        f"up in {server.started_in:.1f} s",
        f"total wall time            {figures['total']:.1f} s",
        f"submit                     {figures['submit']:.1f} s",
        f"processing                 {took:.1f} s, {INVOCATIONS / took:.0f} invocations/s",
        f"after the drain            live daemons checked in {figures.get('live_check', 0):.1f} s,"
        f" server stopped in {figures.get('server_stop', 0):.1f} s",
        f"HTTP requests (client)     {requests}, {requests / took:.0f}/s, "
        f"{requests / INVOCATIONS:.2f} an invocation",
        f"server answers             {dict(sorted(answered.items()))}",
        f"CPU of the server          {server.cpu:.1f} s, "
        f"{1000 * server.cpu / served:.1f} ms a request",
        f"CPU of this process        {figures.get('cpu', 0):.1f} s, "
        f"{1000 * figures.get('cpu', 0) / requests:.1f} ms a request",
        f"claims (limit {CLAIM_LIMIT})           {stats.get('claims', 0)}, "
        f"{stats.get('claimed', 0) / max(1, stats.get('claims', 0)):.1f} invocations each",
        f"list reports               {lists}, "
        f"{stats.get('outcomes in list reports', 0) / max(1, lists):.1f} outcomes each "
        f"({DAEMONS - singles} threads); single reports {stats.get('single reports', 0)} "
        f"({singles} threads)",
        f"requeued (sum attempts-1)  {sum(row[2] - 1 for row in rows if row[2])}",
        f"runs (side effects)        {sum(ledger.executions.values())}",
        f"ran more than once         {sum(1 for n in ledger.executions.values() if n > 1)}",
        f"crashes                    {stats.get('crashes', 0)}",
        f"stalls                     {stats.get('stalls', 0)}",
        f"drops                      {len(chaos.drops)}",
        f"killed by drops            {killed}",
        f"stale completions refused  {stats.get('stale completions refused', 0)} one by one, "
        f"{stats.get('outcomes refused whole', 0)} in lists refused whole (daemon not live)",
        f"lists refused on a retry   {stats.get('list reports refused whole after a retry', 0)}"
        f" ({len(ledger.unknown)} outcomes; {unseen} of them had been recorded by the first try)",
        f"overlapping runs           {overlaps} ({fenced} fenced: the older report refused)",
        f"503s ridden out            {stats.get('503s ridden out', 0)}",
        f"restart                    {figures['restart']} ({figures['restart_s']:.1f} s); "
        + (
            "first success after it "
            + (f"{recovered:.1f} s after it began" if recovered is not None else "never")
        ),
        *(f"  {key}: {stats[key]}" for key in sorted(stats)),
    ]
    return "\n  ".join(lines)


def _check_outcomes(rows: list, ledger, drops: list[dict]) -> None:
    """Every invocation ended: succeeded with exactly one accepted success (its last
    attempt, on the daemon the row names; or, with none accepted, the attempt whose list
    report a retry found refused whole: see Ledger.unknown), or killed because its
    daemon was dropped while it ran that attempt. Nothing queued, running, failed or
    timed out."""
    assert len(rows) == INVOCATIONS
    states = defaultdict(int)
    for row in rows:
        states[row[1]] += 1
    assert set(states) <= {"succeeded", "killed"}, dict(states)
    dropped = {drop["daemon"] for drop in drops}
    killed = 0
    for inv, state, attempts, daemon, reason in rows:
        accepted = ledger.success_attempts.get(inv, set())
        if state == "killed":
            killed += 1
            assert reason == "daemon removed", (inv, reason)
            assert daemon in dropped, f"invocation {inv} killed on daemon {daemon}, not dropped"
            assert ledger.claims.get((inv, attempts)) == daemon, (inv, attempts, daemon)
            assert not accepted, f"killed invocation {inv} has an accepted success {accepted}"
        elif accepted or ledger.unknown.get((inv, attempts)) != daemon:
            assert accepted == {attempts}, f"invocation {inv}: accepted {accepted}, {attempts=}"
            assert ledger.successes[(inv, attempts)] == daemon, inv
        # else: its list report was refused whole on a retry (the daemon lost meanwhile)
        # after the first try had been recorded: still exactly one success, this one.
    counted = sum(drop["ended"] for drop in drops)  # the server's own count, per drop
    if any(drop["retried"] for drop in drops):  # a drop answered on a retry may say 0
        assert counted <= killed, (counted, killed)
    else:
        assert counted == killed, (counted, killed)


def _check_fencing(ledger) -> None:
    """Each attempt went to one daemon, each run was of a claim its daemon held, and no
    invocation ran on two daemons at overlapping times with the older claim's report
    accepted (the server must have refused it: its claim was no longer valid)."""
    assert not ledger.claim_conflicts, ledger.claim_conflicts[:5]
    for run in ledger.runs:
        assert ledger.claims[(run.invocation, run.attempt)] == run.daemon, run
    both = _doubly_accepted(ledger)
    assert both == [], both[:5]


def _leftover(ledger, daemons) -> str:
    """Why work was left: what still runs, on which daemon, and whether a thread knew."""
    rows = Invocation.objects.filter(queue=QUEUE, state__in=["queued", "running"])
    left = rows.count()
    running = list(rows.filter(state="running").values_list("id", "attempts", "daemon_id"))
    states = dict(Daemon.objects.filter(pk__in=[r[2] for r in running]).values_list("id", "state"))
    connection.close()
    current = _current_ids(daemons)
    sample = [
        (
            inv,
            attempt,
            daemon,
            states.get(daemon),
            daemon in current,
            (inv, attempt) in ledger.claims,
        )
        for inv, attempt, daemon in running[:10]
    ]
    return (
        f"work left after {PROCESSING_LIMIT} s: {left} invocations, "
        f"{len(running)} running; (id, attempt, daemon, its state, a thread's current "
        f"daemon, claim seen by a thread): {sample}"
    )


def _by_invocation(ledger) -> dict[int, list]:
    runs = defaultdict(list)
    for run in ledger.runs:
        if run.end is not None:
            runs[run.invocation].append(run)
    return runs


def _overlapping_pairs(ledger):
    for runs in _by_invocation(ledger).values():
        if len(runs) < 2:
            continue
        runs.sort(key=lambda r: r.start)
        for i, first in enumerate(runs):
            for second in runs[i + 1 :]:
                if second.start >= first.end:
                    break
                if first.daemon != second.daemon:
                    yield first, second


def _overlaps(ledger) -> tuple[int, int]:
    """Runs of one invocation on two daemons at overlapping times, and how many of them
    the server fenced (the earlier attempt's report refused: claim_stale, or its list
    refused whole because its daemon was no longer live)."""
    count = fenced = 0
    for first, second in _overlapping_pairs(ledger):
        count += 1
        older = first if first.attempt < second.attempt else second
        fenced += older.answer in REFUSED
    return count, fenced


def _doubly_accepted(ledger) -> list:
    """Overlapping runs on two daemons where the older claim's report was accepted:
    both claims counted as valid at once."""
    bad = []
    for first, second in _overlapping_pairs(ledger):
        older = first if first.attempt < second.attempt else second
        if older.answer == "accepted":
            bad.append((first, second))
    return bad
