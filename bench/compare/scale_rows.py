"""The rows of issue 21's scale: "N idle daemons" (bench/compare/fleet.py drives the
fleet) and the two-server wake-up. Each section measures everything in its prepare
step (one fleet run of `rounds` windows; `rounds` × `two_server_submits` submits), and
its rows hand out one window's or one round's figure a round."""

import random
import statistics
import threading
import time
from collections.abc import Callable

import httpx

from bench.compare.fleet import FleetResult, run_fleet
from bench.compare.rowkit import Budget, Row, Section
from bench.compare.systems import NOOP, Lakeshore, stop_gunicorn
from bench.fleet_swarm import CLAIM_WAIT, REGISTERING_AT_ONCE, percentile
from lakeshore.pool.job_process import Running
from lakeshore.worker.claim_loop import WIRES
from lakeshore.worker.reporting import Outcome

WAKE_QUEUE = "wake"


def sections(lakeshore: Lakeshore, budget: Budget) -> list[Section]:
    return [
        *(fleet_section(lakeshore, budget, n) for n in budget.fleet_sizes),
        two_servers(lakeshore, budget),
    ]


# ---------------------------------------------------------------------------- the fleet


def fleet_section(lakeshore: Lakeshore, budget: Budget, daemons: int) -> Section:
    holder: dict[str, FleetResult] = {}

    def prepare() -> None:
        holder["result"] = run_fleet(
            lakeshore,
            daemons=daemons,
            processes=budget.fleet_processes(daemons),
            windows=budget.rounds,
            window=budget.fleet_window,
            submits=budget.fleet_submits,
            ramp_per_second=budget.fleet_ramp_per_second,
        )

    def figure(metric: str) -> Callable[[], float | None]:
        return lambda: holder["result"].next(metric)

    def why(metric: str) -> Callable[[], str]:
        return lambda: holder["result"].explain(metric) if "result" in holder else ""

    what = f"{daemons:,} idle daemons (as `lakeshore daemon run` sends)"
    rows = [
        Row(f"fleet-cpu-{daemons}", f"{what}: server CPU", "% of a core", False, {}),
        Row(
            f"fleet-heartbeat-{daemons}",
            f"{what}: heartbeat latency p99, of the heartbeats sent",
            "ms",
            False,
            {},
        ),
        Row(
            f"fleet-liveness-{daemons}",
            f"{what}: liveness, the age of a daemon's heartbeat as the server sees it, p99",
            "s",
            False,
            {},
        ),
        Row(f"fleet-submit-{daemons}", f"{what}: submit to claim p99", "ms", False, {}),
        Row(f"fleet-lost-{daemons}", f"{what}: daemons marked lost", "daemons", False, {}),
        Row(
            f"fleet-held-{daemons}",
            f"{what}: polls held and answered within their wait, of those sent",
            "%",
            True,
            {},
        ),
    ]
    for row in rows:
        metric = row.key.split("-")[1]
        row.runs = {Lakeshore.name: figure(metric)}
        row.variant = f"{daemons:,} daemons"
        row.why = why(metric)
    section = Section(f"{daemons:,} idle daemons", rows, prepare=prepare, key="fleet")
    section.notes.append(
        f"one fleet run: the daemons register over max(5 s, N ÷ "
        f"{budget.fleet_ramp_per_second:g}/s), at most {REGISTERING_AT_ONCE} at a time per "
        "generator process (the others wait their turn, so none times out and registers "
        "again); 10 s after the whole fleet has registered "
        f"(the moment is in the note below), one {budget.fleet_window:.0f} s window a round "
        "(the rounds back to back); each claims and heartbeats as the "
        "daemon's own code says (bench/fleet_swarm.py imports its defaults and rules); "
        f"{budget.fleet_submits} jobs submitted a window, one at a time, evenly spaced, each "
        "completed by the daemon that claims it (an exchange); the reaper runs every "
        "LAKESHORE_TICK_SECONDS as Celery beat would, and the daemons lost are the whole "
        "run's (counted when the generators stop: the same figure every round); server "
        "CPU: the gunicorn processes' CPU time (/proc); a poll is held when the server lets "
        "it wait (no Retry-After) and answers it within its wait + 2 s; a heartbeat that "
        "failed or never came back counts as infinitely slow; an idle daemon skips its "
        "heartbeat when a poll was answered within the interval (the daemon's rule, "
        "lakeshore.worker.heartbeat.claims_renew), so the heartbeat row times only those "
        "sent (none sent in a window: no figure); liveness is what the reaper sees: every 2 s "
        "the p99 of the live daemons' heartbeat ages (a daemon parked in a claim is renewed "
        "by the server it waits in, fleet/parked.py), the highest look of the window; the "
        "generators' own CPU is "
        "given per window (near 100 % of a core a process, their lag would be in the figures)"
    )
    section.notes.append(lambda: holder["result"].summary() if "result" in holder else "—")
    if daemons == 500:
        section.notes.append(
            "the row this replaces (500 bench coroutines, each claiming with wait 20 and no "
            "heartbeats) measured 9.45 % of a core on 2026-12-04 for about half the fleet: "
            "198–377 polls answered per 20 s window"
        )
    return section


# ---------------------------------------------------------------------------- two servers


class TwoServers:
    """A second server process (the first one's configuration, another port, the same
    database); a daemon long-polls on it while jobs are submitted on the first."""

    def __init__(self, lakeshore: Lakeshore, budget: Budget):
        self.ls = lakeshore
        self.budget = budget
        self.claimed: dict[str, float] = {}
        self.stopping = threading.Event()
        self.rounds: list[tuple[float, float, list[float]]] = []  # p50, p99, all (s)
        self.taken = {"p50": 0, "p99": 0}
        self.failure: BaseException | None = None
        self.early = 0  # claimed before the submit's answer arrived (timed from its send)

    def measure(self) -> None:
        server, url = self.ls.serve()
        daemon = threading.Thread(target=self._daemon, args=(url,), daemon=True)
        try:
            with self.ls.client() as client:
                answer = client.post("/api/v1/queues/", json={"name": WAKE_QUEUE})
                if answer.status_code not in (201, 409):
                    answer.raise_for_status()
                daemon.start()
                time.sleep(1.0)  # registered, and its first poll parked
                for _ in range(self.budget.rounds):
                    took = [self._one(client) for _ in range(self.budget.two_server_submits)]
                    self.rounds.append((statistics.median(took), percentile(took, 99), took))
        finally:
            self.stopping.set()
            self.ls.sql("UPDATE fleet_daemon SET state = 'terminated' WHERE name = 'wake'")
            self.ls.sql("SELECT pg_notify('lakeshore_work', %s)", [WAKE_QUEUE])
            if daemon.ident is not None:  # started: a failure before it keeps its own error
                daemon.join(CLAIM_WAIT + 5)
            stop_gunicorn(server)
            self.ls.reset()
        if self.failure is not None:
            raise RuntimeError(f"the daemon on the second server failed: {self.failure}")

    def _one(self, client: httpx.Client) -> float:
        time.sleep(random.uniform(0.05, 0.15))  # noqa: S311 - its poll parked again
        body = {"function": NOOP, "queue": WAKE_QUEUE, "args": [1]}
        sent = time.monotonic()
        answer = client.post("/api/v1/jobs/", json=body).raise_for_status()
        answered, job = time.monotonic(), str(answer.json()["id"])
        deadline = answered + 10
        while job not in self.claimed:
            if time.monotonic() > deadline or self.failure is not None:
                raise RuntimeError(f"job {job} was not claimed within 10 s")
            time.sleep(0.001)
        claimed = self.claimed.pop(job)
        if claimed < answered:  # its claim's answer came first: from the submit's send
            self.early += 1
            return claimed - sent
        return claimed - answered

    def _daemon(self, url: str) -> None:
        """Registers on the second server and long-polls there as an idle daemon does,
        completing what it claims in an exchange."""
        try:
            with httpx.Client(base_url=url, timeout=60) as client:
                client.headers["Authorization"] = f"Bearer {self.ls.tokens['daemon']}"
                body = {"name": "wake", "queues": [WAKE_QUEUE]}
                me = client.post("/api/v1/daemons/register/", json=body).raise_for_status()
                me = me.json()
                client.headers["Authorization"] = f"Bearer {me['token']}"
                claim = f"/api/v1/daemons/{me['id']}/claim/"
                exchange = f"/api/v1/daemons/{me['id']}/exchange/"
                while not self.stopping.is_set():
                    answer = client.post(
                        claim, json={"limit": 1, "wait": CLAIM_WAIT, "wires": WIRES}
                    )
                    if answer.status_code == 409:
                        return  # terminated at the end
                    jobs = answer.raise_for_status().json()
                    while jobs:
                        moment = time.monotonic()
                        for job in jobs:
                            self.claimed[str(job["id"])] = moment
                        outcomes = [
                            Outcome(Running(j, daemon_id=me["id"]), "succeeded", None, "", 0.0)
                            for j in jobs
                        ]
                        answer = client.post(
                            exchange,
                            json={
                                "outcomes": [o.body() for o in outcomes],
                                "limit": 1,
                                "wait": 0,
                                "wires": WIRES,
                            },
                        )
                        if answer.status_code == 409:
                            return
                        jobs = answer.raise_for_status().json().get("claimed") or []
        except BaseException as exc:  # noqa: BLE001 - reported by measure()
            self.failure = exc

    def next(self, which: str) -> float:
        index = self.taken[which]
        self.taken[which] = index + 1
        p50, p99, _ = self.rounds[index]
        return 1000 * (p50 if which == "p50" else p99)

    def summary(self) -> str:
        every = [t for _, _, took in self.rounds for t in took]
        if not every:
            return "not measured"
        return (
            f"{len(every)} submits on server A, each claimed by the daemon polling server B: "
            f"p50 {1000 * statistics.median(every):.1f} ms, p99 "
            f"{1000 * percentile(every, 99):.1f} ms, fastest {1000 * min(every):.1f} ms, "
            f"slowest {1000 * max(every):.1f} ms over all rounds; {self.early} claimed before "
            "their submit's answer arrived (timed from the submit's send instead)"
        )


def two_servers(lakeshore: Lakeshore, budget: Budget) -> Section:
    pair = TwoServers(lakeshore, budget)
    n = budget.two_server_submits
    rows = [
        Row(
            f"two-server-{which}",
            f"two-server wake-up: submit on A → claim on B, {which} of {n} submits",
            "ms",
            False,
            {Lakeshore.name: lambda w=which: pair.next(w)},
            variant=which,
        )
        for which in ("p50", "p99")
    ]
    section = Section("Two servers, one database", rows, prepare=pair.measure, key="two-server")
    section.notes.append(
        "two gunicorn processes started as the bench starts Lakeshore's (two ports, the same "
        "PostgreSQL); one daemon registered on B long-polls there (claim wait as the daemon's "
        "idle wait) and completes what it claims; each round submits one job at a time on "
        "A, 50–150 ms after the previous claim, timed from the submit's answer to the claim "
        "answer that carries it (the clock of one process)"
    )
    section.notes.append(pair.summary)
    return section
