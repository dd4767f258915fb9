"""The rows of the table: what each one measures on each system, within what budget.

A Section groups rows that share a preparation (the rows filled for the list pages;
the N idle daemons of scale_rows.py, one fleet run for all their rows). A Row maps
each system that has the operation to a function that makes one measurement and
returns it in the row's unit; the runner (__main__) calls each of them once per round,
the systems in a rotated order each round."""

import itertools
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from psycopg.types.json import Jsonb

from bench.compare.infra import stop_process
from bench.compare.lines import LineClient
from bench.compare.systems import NOOP, PRINTER, Lakeshore, Procrastinate, RawSQL, stop_gunicorn

LAKESHORE, RAW, PROCRASTINATE = Lakeshore.name, RawSQL.name, Procrastinate.name
SYSTEMS = (LAKESHORE, RAW, PROCRASTINATE)
JOBS_PER_S = "jobs/s"


@dataclass(frozen=True)
class Budget:
    rounds: int = 3
    submit_seconds: float = 3.0  # submit one at a time, per measurement
    floor_seconds: float = 2.0  # the floor under it (floor_app.py), per measurement
    batch_seconds: float = 2.0  # batches (at least one), per measurement
    batch_sizes: tuple[int, ...] = (10_000, 1_000)  # the largest the server takes is used
    claim_seconds: float = 1.5  # claim + complete, per measurement
    claim_backlog: dict = field(default_factory=lambda: {LAKESHORE: 5_000, RAW: 40_000})
    e2e_jobs: int = 1_000  # end to end: this many jobs, or e2e_seconds, whichever first
    e2e_seconds: float = 6.0
    procrastinate_processes: int = 2  # its expert configuration: worker processes (cores)
    fleet_sizes: tuple[int, ...] = (500, 5_000)  # "N idle daemons" (BENCH_FLEET_SIZES)
    fleet_window: float = 20.0  # one window a round, the rounds back to back
    fleet_submits: int = 10  # jobs submitted one at a time a window (submit to claim)
    fleet_ramp_per_second: float = 200.0  # daemons registering a second, at most
    fleet_per_process: int = 2_500  # simulated daemons a generator process (its CPU)
    two_server_submits: int = 50  # a round of the two-server wake-up
    cancel_rows: int = 100_000
    list_sizes: tuple[int, ...] = (100_000, 1_000_000)
    list_samples: int = 10  # requests per page kind per round (median), within 2 s
    tick_queues: int = 1_000
    tick_daemons: int = 10_000
    claim_kind_seconds: float = 1.0  # queue_bench's per-kind claim figures

    @classmethod
    def quick(cls) -> "Budget":
        """BENCH_QUICK=1: a smoke run of every row in about a minute."""
        return cls(
            rounds=1,
            submit_seconds=0.5,
            floor_seconds=0.3,
            batch_seconds=0.5,
            claim_seconds=0.5,
            claim_backlog={LAKESHORE: 3_000, RAW: 10_000},
            e2e_jobs=50,
            e2e_seconds=3.0,
            fleet_sizes=(100,),
            fleet_window=6.0,
            fleet_submits=5,
            two_server_submits=10,
            cancel_rows=5_000,
            list_sizes=(5_000, 20_000),
            list_samples=3,
            tick_queues=20,
            tick_daemons=100,
            claim_kind_seconds=0.2,
        )

    def fleet_processes(self, daemons: int) -> int:
        return max(1, -(-daemons // self.fleet_per_process))


@dataclass
class Row:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    runs: dict[str, Callable[[], float]]
    variant: str = ""  # what tells it from its sibling rows (targets name it)
    # A row whose procrastinate figure is another row's (the same worker run, measured
    # once): that row's key.
    procrastinate_from: str | None = None
    # Why a target on this row may be missed, from the run's own figures ("" if unknown).
    why: Callable[[], str] | None = None


@dataclass
class Section:
    title: str
    rows: list[Row]
    prepare: Callable[[], object] | None = None
    finish: Callable[[], object] | None = None
    notes: list[str | Callable[[], str]] = field(default_factory=list)  # callables: at the end
    key: str = ""  # what BENCH_ONLY names it by (see __main__)


# ---------------------------------------------------------------------------- helpers


def throughput(steps: list[Callable[[], int]], seconds: float) -> float:
    """Run each step in a thread of its own, again and again, for `seconds`; a step
    returns how many jobs it did (0: nothing left). Jobs per second, all threads."""
    counts = [0] * len(steps)
    failures: list[Exception] = []
    started = time.perf_counter()
    deadline = started + seconds

    def work(i: int) -> None:
        try:
            while time.perf_counter() < deadline:
                done = steps[i]()
                if not done:
                    return
                counts[i] += done
        except Exception as exc:  # noqa: BLE001 - raised again below, in the caller
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(steps))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return sum(counts) / (time.perf_counter() - started)


def median_ms(call: Callable[[], object], samples: int, seconds: float = 2.0) -> float:
    """The median of `samples` calls, or of those made in `seconds` (3 at least), in ms."""
    call()  # warm: connection, caches
    took: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(took) < samples and (len(took) < 3 or time.perf_counter() < deadline):
        started = time.perf_counter()
        call()
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


def wait_until(done: Callable[[], bool], seconds: float, every: float = 0.05) -> None:
    """Poll `done` until it holds or `seconds` pass."""
    deadline = time.perf_counter() + seconds
    while not done() and time.perf_counter() < deadline:
        time.sleep(every)


def outcomes(claimed: list[dict]) -> list[dict]:
    return [
        {"invocation": int(job["id"]), "attempt": job["attempts"], "state": "succeeded"}
        for job in claimed
    ]


RAW_CLAIM = """
UPDATE jobs SET state = 'running', attempts = attempts + 1
 WHERE id = ANY(ARRAY(SELECT id FROM jobs WHERE queue = %s AND state = 'queued'
                       ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED))
RETURNING id"""
RAW_FINISH = "UPDATE jobs SET state = 'succeeded', finished_at = now() WHERE id = ANY(%s)"


# ---------------------------------------------------------------------------- the rows


class Rows:
    def __init__(
        self,
        lakeshore: Lakeshore,
        raw: RawSQL,
        procrastinate: Procrastinate | None,
        probes: LineClient | None,
        budget: Budget,
    ):
        self.ls = lakeshore
        self.raw = raw
        self.pc = procrastinate
        self.probes = probes  # django_probes.py, once the HTTP rows are done
        self.budget = budget
        self.batch_size = budget.batch_sizes[-1]
        self.list_rows = 0
        self.cursor: dict[str, object] = {}  # per system: the keyset cursor at depth
        # procrastinate end to end, per concurrency: each configuration's figures
        self.pc_configs: dict[int, dict[str, list[float]]] = {}

    def _runs(self, **by_system: Callable[[], float]) -> dict[str, Callable[[], float]]:
        """The measurements of the systems present (procrastinate may be missing)."""
        names = {"lakeshore": LAKESHORE, "raw": RAW, "procrastinate": PROCRASTINATE}
        runs = {names[key]: run for key, run in by_system.items()}
        if self.pc is None:
            runs.pop(PROCRASTINATE, None)
        return runs

    def sections(self) -> list[Section]:
        return [
            self._submit(),
            self._claim_complete(),
            self._end_to_end(),
            self._bulk_cancel(),
            *(self._lists(size) for size in self.budget.list_sizes),
        ]

    # ------------------------------------------------------------------ submit

    def _submit(self) -> Section:
        b = self.budget
        section = Section(
            "Submit",
            [
                Row(
                    "submit-one",
                    "submit one at a time (HTTP POST · defer · INSERT)",
                    JOBS_PER_S,
                    True,
                    self._runs(
                        lakeshore=self.lakeshore_submit_one,
                        raw=self.raw_submit_one,
                        procrastinate=lambda: self.pc.rate("defer_one", seconds=b.submit_seconds),
                    ),
                ),
                Row(
                    "batch",
                    "batch submit (HTTP list · batch_defer · INSERT … SELECT unnest)",
                    JOBS_PER_S,
                    True,
                    self._runs(
                        lakeshore=self.lakeshore_batch,
                        raw=self.raw_batch,
                        procrastinate=lambda: self.pc.rate(
                            "batch_defer", size=self.batch_size, seconds=b.batch_seconds
                        ),
                    ),
                ),
            ],
            prepare=self.find_batch_size,
            finish=self.reset_all,
            key="submit",
        )
        section.notes.append(lambda: f"batches of {self.batch_size:,} per request/call")
        section.notes.append(self.submit_floor)
        return section

    def submit_floor(self) -> str:
        """The floor under "submit one at a time", measured in this run: the same
        gunicorn configuration and httpx client, with a hello world and then with the
        submit's own INSERT but no Django (bench/compare/floor_app.py), in rounds with
        Lakeshore's own submit and procrastinate's defer, each round taking them in turn,
        so that the ratios compare figures of the same moments."""
        b = self.budget
        server, url = self.ls.serve("bench.compare.floor_app:app")
        runs: dict[str, Callable[[], float]] = {
            "hello": lambda: self._post_rate(url, "/hello", b.floor_seconds),
            "floor": lambda: self._post_rate(url, "/insert", b.floor_seconds),
            "lakeshore": lambda: self._post_rate(
                self.ls.base_url, "/api/v1/jobs/", b.floor_seconds
            ),
        }
        if self.pc is not None:
            runs["defer"] = lambda: self.pc.rate("defer_one", seconds=b.floor_seconds)
        rates: dict[str, list[float]] = {name: [] for name in runs}
        try:
            for turn in range(b.rounds):
                names = list(runs)
                for name in names[turn % len(names) :] + names[: turn % len(names)]:
                    rates[name].append(runs[name]())
        finally:
            stop_gunicorn(server)
            self.reset_all()

        def median(name: str) -> float:
            return statistics.median(rates[name])

        def paired(top: str, bottom: str) -> float:
            """The median of the rounds' ratios."""
            return statistics.median(a / b for a, b in zip(rates[top], rates[bottom], strict=True))

        text = (
            f"the floor of one submit over HTTP, measured now ({b.rounds} rounds, each "
            f"taking the {len(runs)} in turn; medians, and ratios as the median of the "
            "rounds' ratios): under Lakeshore's gunicorn configuration, from the same httpx "
            f"client, a hello world answers {median('hello'):,.0f} POSTs/s; the submit's own "
            "INSERT without Django (bench/compare/floor_app.py) "
            f"{median('floor'):,.0f} jobs/s"
        )
        if "defer" in rates:
            text += (
                f", {paired('floor', 'defer'):.2f}× defer ({median('defer'):,.0f} jobs/s in "
                "the same rounds)"
            )
        return text + (
            f"; Lakeshore's submit {median('lakeshore'):,.0f} jobs/s, "
            f"{paired('lakeshore', 'floor'):.2f}× that floor"
        )

    def _post_rate(self, url: str, path: str, seconds: float) -> float:
        """POSTs/s of one client sending the submit row's body to `path`, one at a time."""
        counter = itertools.count()
        headers = {"Authorization": f"Bearer {self.ls.tokens['operator']}"}
        with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
            client.post(path, json={"function": NOOP, "queue": "bench", "args": [0]})  # warm

            def step() -> int:
                body = {"function": NOOP, "queue": "bench", "args": [next(counter)]}
                client.post(path, json=body).raise_for_status()
                return 1

            return throughput([step], seconds)

    def find_batch_size(self) -> None:
        """The largest batch the server takes (1,000 today; maybe 10,000 soon), tried
        on a queue with room for one job: a batch too large is refused (400) before
        anything else, one it takes stops at its second job (full, all rolled back)."""
        with self.ls.client() as client:
            client.post("/api/v1/queues/", json={"name": "batch-probe", "max_depth": 1})
            for size in self.budget.batch_sizes:
                body = [{"function": NOOP, "queue": "batch-probe"}] * size
                if client.post("/api/v1/jobs/", json=body).status_code != 400:
                    self.batch_size = size
                    break
        self.reset_all()

    def reset_all(self) -> None:
        self.ls.reset()
        self.raw.reset()
        self.list_rows = 0
        if self.pc is not None:
            self.pc.reset()

    def lakeshore_submit_one(self) -> float:
        counter = itertools.count()
        with self.ls.client() as client:
            client.get("/healthz")

            def step() -> int:
                body = {"function": NOOP, "queue": "bench", "args": [next(counter)]}
                client.post("/api/v1/jobs/", json=body).raise_for_status()
                return 1

            return throughput([step], self.budget.submit_seconds)

    def raw_submit_one(self) -> float:
        counter = itertools.count()
        with self.raw.connect() as conn:

            def step() -> int:
                conn.execute(
                    "INSERT INTO jobs (queue, payload) VALUES (%s, %s)",
                    ["bench", Jsonb({"i": next(counter)})],
                )
                return 1

            return throughput([step], self.budget.submit_seconds)

    def _batched(self, step: Callable[[], int]) -> float:
        """At least one batch, then more until the budget is spent; jobs/s."""
        done, started = 0, time.perf_counter()
        while not done or time.perf_counter() - started < self.budget.batch_seconds:
            done += step()
        return done / (time.perf_counter() - started)

    def lakeshore_batch(self) -> float:
        body = [{"function": NOOP, "queue": "bench", "args": [i]} for i in range(self.batch_size)]
        with self.ls.client() as client:
            client.get("/healthz")

            def step() -> int:
                client.post("/api/v1/jobs/", json=body).raise_for_status()
                return self.batch_size

            return self._batched(step)

    def raw_batch(self) -> float:
        payloads = [json.dumps({"i": i}) for i in range(self.batch_size)]
        with self.raw.connect() as conn:

            def step() -> int:
                conn.execute(
                    "INSERT INTO jobs (queue, payload) "
                    "SELECT %s, p::jsonb FROM unnest(%s::text[]) p",
                    ["bench", payloads],
                )
                return self.batch_size

            return self._batched(step)

    # ------------------------------------------------------------------ claim + complete

    def _claim_complete(self) -> Section:
        rows = [
            Row(
                f"cc-{daemons}x{limit}",
                f"claim + complete, {daemons} daemon{'s' if daemons > 1 else ''}, "
                f"limit {limit} (HTTP · UPDATE … SKIP LOCKED + finish)",
                JOBS_PER_S,
                True,
                self._runs(
                    lakeshore=lambda d=daemons, n=limit: self.lakeshore_claim_complete(d, n),
                    raw=lambda d=daemons, n=limit: self.raw_claim_complete(d, n),
                ),
            )
            for daemons in (1, 8)
            for limit in (1, 10)
        ]
        rows += [
            Row(
                f"cc-{daemons}x1-exchange",
                f"claim + complete in one exchange, {daemons} daemon{'s' if daemons > 1 else ''}, "
                "limit 1 (HTTP · UPDATE … SKIP LOCKED + finish)",
                JOBS_PER_S,
                True,
                self._runs(
                    lakeshore=lambda d=daemons: self.lakeshore_exchange(d, 1),
                    raw=lambda d=daemons: self.raw_claim_complete(d, 1),
                ),
                variant="in one exchange",
            )
            for daemons in (1, 8)
        ]
        section = Section("Claim + complete (no job run)", rows, finish=self.reset_all, key="claim")
        section.notes.append(
            "Lakeshore: each daemon a thread with its own keep-alive connection; "
            "limit 1 reports one outcome, limit 10 reports its claim as one list"
        )
        section.notes.append(
            "in one exchange: each request (POST …/exchange/) reports the outcomes of the "
            "previous claim and claims the next, as `lakeshore daemon run` does; the first "
            "claim is made before the clock starts"
        )
        return section

    def lakeshore_claim_complete(self, daemons: int, limit: int) -> float:
        self.ls.reset()
        self.ls.fill("cc", self.budget.claim_backlog[LAKESHORE])
        clients = [self.ls.client("daemon") for _ in range(daemons)]
        try:

            def step_for(client: httpx.Client, daemon_id: str) -> Callable[[], int]:
                claim = f"/api/v1/daemons/{daemon_id}/claim/"
                complete = f"/api/v1/daemons/{daemon_id}/complete/"

                def step() -> int:
                    claimed = client.post(claim, json={"limit": limit}).raise_for_status()
                    done = outcomes(claimed.json())
                    if done:
                        body = done if limit > 1 else done[0]
                        client.post(complete, json=body).raise_for_status()
                    return len(done)

                return step

            steps = [
                step_for(client, self.ls.register(client, f"cc-{i}", "cc"))
                for i, client in enumerate(clients)
            ]
            return throughput(steps, self.budget.claim_seconds)
        finally:
            for client in clients:
                client.close()

    def lakeshore_exchange(self, daemons: int, limit: int) -> float:
        self.ls.reset()
        self.ls.fill("cc", self.budget.claim_backlog[LAKESHORE])
        clients = [self.ls.client("daemon") for _ in range(daemons)]
        try:

            def step_for(client: httpx.Client, daemon_id: str) -> Callable[[], int]:
                url = f"/api/v1/daemons/{daemon_id}/exchange/"
                first = client.post(url, json={"limit": limit}).raise_for_status()
                held = outcomes(first.json()["claimed"])

                def step() -> int:
                    body = {"outcomes": held, "limit": limit}
                    answer = client.post(url, json=body).raise_for_status().json()
                    done = sum(1 for item in answer["recorded"] if item["ok"])
                    if done != len(held):
                        raise RuntimeError(f"{len(held) - done} outcomes refused: {answer}")
                    held[:] = outcomes(answer["claimed"])
                    return done

                return step

            steps = [
                step_for(client, self.ls.register(client, f"ex-{i}", "cc"))
                for i, client in enumerate(clients)
            ]
            return throughput(steps, self.budget.claim_seconds)
        finally:
            for client in clients:
                client.close()

    def raw_claim_complete(self, connections: int, limit: int) -> float:
        self.raw.reset()
        self.raw.fill("cc", self.budget.claim_backlog[RAW])
        conns = [self.raw.connect() for _ in range(connections)]
        try:

            def step_for(conn) -> Callable[[], int]:
                def step() -> int:
                    ids = [row[0] for row in conn.execute(RAW_CLAIM, ["cc", limit]).fetchall()]
                    if ids:
                        conn.execute(RAW_FINISH, [ids])
                    return len(ids)

                return step

            return throughput([step_for(conn) for conn in conns], self.budget.claim_seconds)
        finally:
            for conn in conns:
                conn.close()

    # ------------------------------------------------------------------ end to end

    def _end_to_end(self) -> Section:
        modes = self.ls.isolation_modes or [None]
        rows = []
        for concurrency in (1, 8):
            first = f"e2e-c{concurrency}"
            for mode in modes:
                how = f"--isolation {mode}" if mode else "a process per job"
                runs = {"lakeshore": lambda c=concurrency, m=mode: self.lakeshore_e2e(c, m)}
                if mode == modes[0]:  # procrastinate's worker once per concurrency
                    runs["procrastinate"] = lambda c=concurrency: self.procrastinate_e2e(c)
                rows.append(
                    Row(
                        first if mode == modes[0] else f"{first}-{mode}",
                        f"end to end, concurrency {concurrency} (daemon, {how} · worker)",
                        JOBS_PER_S,
                        True,
                        self._runs(**runs),
                        variant=how,
                        procrastinate_from=None if mode == modes[0] else first,
                    )
                )
        for mode in modes:  # the cost of capturing what jobs print (issue 19)
            how = f"--isolation {mode}" if mode else "a process per job"
            rows.append(
                Row(
                    f"e2e-print-c8-{mode}",
                    f"end to end, jobs that print 100 lines, concurrency 8 (daemon, {how})",
                    JOBS_PER_S,
                    True,
                    self._runs(lakeshore=lambda m=mode: self.lakeshore_e2e(8, m, printing=True)),
                    variant=how,
                )
            )
        b = self.budget
        section = Section("End to end (real daemon · procrastinate's worker)", rows, key="e2e")
        section.notes.append(
            f"{b.e2e_jobs:,} no-op jobs queued at once in one statement, or "
            f"{b.e2e_seconds:.0f} s, whichever first; timed from the insert to the last "
            "success; Lakeshore runs lakeshore.functions.echo through `lakeshore daemon run`, "
            "procrastinate a no-op task (see below); the rows of jobs that print run "
            f"{PRINTER[0]}{tuple(PRINTER[1])} (100 lines, each flushed) instead, their "
            "output captured, shipped and stored per job"
        )
        if self.pc is not None:
            section.notes.append(self.procrastinate_configs)
        if len(modes) > 1:
            section.notes.append(
                f"procrastinate's figure in the rows of modes other than {modes[0]} is the "
                "worker run of the row above (measured once per concurrency)"
            )
        if not self.ls.isolation_modes:
            section.notes.append(
                "`lakeshore daemon run --help` shows no --isolation flag: measured the "
                "current mode only (each job in a fresh process)"
            )
        return section

    def lakeshore_e2e(
        self, concurrency: int, isolation: str | None, *, printing: bool = False
    ) -> float:
        b = self.budget
        self.ls.reset()
        name = f"e2e-c{concurrency}-{isolation or 'default'}{'-print' if printing else ''}"
        daemon = self.ls.start_daemon(
            queue="e2e", concurrency=concurrency, isolation=isolation, name=name
        )
        try:
            self.ls.wait_registered(name, daemon)
            started = time.perf_counter()
            if printing:
                function, args = PRINTER
                self.ls.fill("e2e", b.e2e_jobs, analyze=False, function=function, args=args)
            else:
                self.ls.fill("e2e", b.e2e_jobs, analyze=False)
            wait_until(lambda: self.ls.count("e2e", "succeeded") >= b.e2e_jobs, b.e2e_seconds)
            took = time.perf_counter() - started
            done = self.ls.count("e2e", "succeeded")
            failed = self.ls.count("e2e", "failed")
            if failed:
                raise RuntimeError(f"{failed} jobs failed; see {self.ls.logs / (name + '.log')}")
            return done / took
        finally:
            stop_process(daemon)
            self.ls.reset()

    def procrastinate_e2e(self, concurrency: int) -> float:
        """The faster of procrastinate's two configurations, taken in turn: the worker
        as today (one process, a sync task, a pool of up to 10), and as an expert runs it
        (worker_expert: a process a core sharing the concurrency, an async task, its pool
        opened at full size). Both figures are kept for the notes."""
        b = self.budget
        runs = {
            "as before": lambda: self.pc.rate(
                "worker", concurrency=concurrency, jobs=b.e2e_jobs, seconds=b.e2e_seconds
            ),
            "expert": lambda: self.pc.rate(
                "worker_expert",
                concurrency=concurrency,
                processes=b.procrastinate_processes,
                jobs=b.e2e_jobs,
                seconds=b.e2e_seconds,
            ),
        }
        kept = self.pc_configs.setdefault(concurrency, {name: [] for name in runs})
        order = list(runs) if len(kept["expert"]) % 2 == 0 else list(runs)[::-1]
        for name in order:
            self.pc.reset()
            kept[name].append(runs[name]())
        return max(kept[name][-1] for name in runs)

    def procrastinate_configs(self) -> str:
        """Both configurations' figures, and which one the table shows."""
        if not self.pc_configs:
            return "procrastinate not measured"
        parts = []
        for concurrency, kept in sorted(self.pc_configs.items()):
            expert = kept["expert"]
            processes = max(1, min(self.budget.procrastinate_processes, concurrency))
            faster = sum(e > t for e, t in zip(expert, kept["as before"], strict=True))
            parts.append(
                f"concurrency {concurrency}: as before "
                + ", ".join(f"{v:,.0f}" for v in kept["as before"])
                + f" jobs/s; as an expert runs it ({processes} process(es) × "
                f"{concurrency // processes}) "
                + ", ".join(f"{v:,.0f}" for v in expert)
                + f" jobs/s; the expert configuration was the faster in {faster} of "
                f"{len(expert)} round(s)"
            )
        return (
            "procrastinate's column is the faster of its two configurations in each round: "
            "its worker as before (one process, a sync task, a pool of up to 10), and as an "
            "expert runs it (worker processes, one a core, sharing the concurrency; an "
            "`async def` task; each process's pool opened at its full size up front, "
            "PsycopgConnector min_size = max_size = its concurrency + 2); " + "; ".join(parts)
        )

    # ------------------------------------------------------------------ bulk cancel

    def _bulk_cancel(self) -> Section:
        n = self.budget.cancel_rows
        row = Row(
            "bulk-cancel",
            f"bulk-cancel {n:,} queued (HTTP bulk-cancel · one UPDATE)",
            "s",
            False,
            self._runs(lakeshore=self.lakeshore_cancel, raw=self.raw_cancel),
        )
        return Section("Bulk cancel", [row], finish=self.reset_all, key="cancel")

    def lakeshore_cancel(self) -> float:
        n = self.budget.cancel_rows
        self.ls.reset()
        self.ls.fill("cancel", n)
        with self.ls.client() as client:
            client.get("/healthz")
            started = time.perf_counter()
            answer = client.post("/api/v1/jobs/bulk-cancel/", json={"queue": "cancel"})
            took = time.perf_counter() - started
        cancelled = answer.raise_for_status().json()["cancelled"]
        if cancelled != n:
            raise RuntimeError(f"bulk-cancel cancelled {cancelled} of {n}")
        return took

    def raw_cancel(self) -> float:
        self.raw.reset()
        self.raw.fill("cancel", self.budget.cancel_rows)
        started = time.perf_counter()
        self.raw.db.execute(
            "UPDATE jobs SET state = 'killed', finished_at = now() "
            "WHERE queue = %s AND state = 'queued'",
            ["cancel"],
        )
        return time.perf_counter() - started

    # ------------------------------------------------------------------ list pages

    def _lists(self, size: int) -> Section:
        depth = size - 100
        pages = (
            ("page1", "page 1", "?limit=50"),
            ("offset", f"offset {depth:,}", f"?limit=50&offset={depth}"),
            ("cursor", "cursor at the same depth (from the Link header)", None),
        )
        rows = [
            Row(
                f"list-{size}-{key}",
                f"list {size:,} rows, 50 a page: {label}",
                "ms",
                False,
                self._runs(
                    lakeshore=lambda q=query: self.lakeshore_list(q),
                    raw=lambda k=key, d=depth: self.raw_list(k, d),
                ),
            )
            for key, label, query in pages
        ]
        last = size == self.budget.list_sizes[-1]  # the tables grow from one size to the next
        section = Section(
            f"Jobs list at {size:,} rows (GET /api/v1/jobs/ · SELECT)",
            rows,
            prepare=lambda: self.fill_lists(size, depth),
            finish=self.reset_all if last else None,
            key="lists",
        )
        section.notes.append(
            f"median of {self.budget.list_samples} requests a round (fewer if they take over "
            "2 s: at least 3), each the whole request"
        )
        return section

    def fill_lists(self, size: int, depth: int) -> None:
        """Grow both tables to `size` finished rows, and find the cursor at `depth`."""
        if self.list_rows == 0:
            self.reset_all()
        more = size - self.list_rows
        self.ls.fill("list", more, state="succeeded")
        self.raw.fill("list", more, state="succeeded")
        self.list_rows = size
        with self.ls.client() as client:
            page = client.get(f"/api/v1/jobs/?limit=50&offset={depth}").raise_for_status()
        self.cursor[LAKESHORE] = page.links["next"]["url"]
        self.cursor[RAW] = self.raw.db.execute(
            "SELECT id FROM jobs ORDER BY id DESC LIMIT 1 OFFSET %s", [depth + 49]
        ).fetchone()[0]

    def lakeshore_list(self, query: str | None) -> float:
        url = f"/api/v1/jobs/{query}" if query else self.cursor[LAKESHORE]
        with self.ls.client() as client:
            return median_ms(
                lambda: client.get(url).raise_for_status().json(), self.budget.list_samples
            )

    def raw_list(self, key: str, depth: int) -> float:
        select = "SELECT * FROM jobs {where} ORDER BY id DESC LIMIT 51 {offset}"
        query, params = {
            "page1": (select.format(where="", offset=""), []),
            "offset": (select.format(where="", offset="OFFSET %s"), [depth]),
            "cursor": (select.format(where="WHERE id < %s", offset=""), [self.cursor[RAW]]),
        }[key]
        with self.raw.connect() as conn:
            return median_ms(
                lambda: conn.execute(query, params).fetchall(), self.budget.list_samples
            )

    # ------------------------------------------------------------------ in-process probes

    def in_process(self) -> Section:
        """Measured inside Django (django_probes.py), once the HTTP server is stopped."""
        b = self.budget
        row = Row(
            "tick",
            f"controller tick over {b.tick_queues:,} queues × {b.tick_daemons:,} daemons",
            "s",
            False,
            {LAKESHORE: lambda: self.probes.call("tick")["seconds"]},
        )
        section = Section(
            "Controller (in-process, fleet.controller.tick(), simulated provider)",
            [row],
            prepare=lambda: self.probes.call(
                "tick_setup", queues=b.tick_queues, daemons=b.tick_daemons
            ),
            finish=lambda: self.probes.call("tick_cleanup"),
            key="tick",
        )
        section.notes.append(
            "steady state: each queue at its fixed size, so a tick decides and records, "
            "launches and terminates nothing"
        )
        return section

    def claim_kinds(self) -> list[str]:
        """The old per-kind claim figures of queue_bench.py (one run, not medians)."""
        seconds = self.budget.claim_kind_seconds
        return self.probes.call("claim_kinds", seconds=seconds)["lines"]
