"""The rows of the table: what each one measures on each system, within what budget.
Rows (here: submit, the controller tick, claims per queue kind) gathers the mixins of
worker_rows.py (claim + complete, end to end) and table_rows.py (bulk-cancel, lists);
rowkit.py has the Budget, Row, Section and timing helpers they share."""

import itertools
import json
import statistics
import time
from collections.abc import Callable

import httpx
from psycopg.types.json import Jsonb

from bench.compare.celery_driver import CeleryPeer
from bench.compare.door_rows import DoorRows
from bench.compare.lines import LineClient
from bench.compare.rowkit import (
    CELERY,
    JOBS_PER_S,
    LAKESHORE,
    PROCRASTINATE,
    RAW,
    RQ,
    Budget,
    Row,
    Section,
    throughput,
)
from bench.compare.rq_driver import RQPeer
from bench.compare.systems import NOOP, Lakeshore, Procrastinate, RawSQL, stop_gunicorn
from bench.compare.table_rows import TableRows
from bench.compare.worker_rows import WorkerRows

# ---------------------------------------------------------------------------- the rows


class Rows(WorkerRows, DoorRows, TableRows):
    def __init__(
        self,
        lakeshore: Lakeshore,
        raw: RawSQL,
        procrastinate: Procrastinate | None,
        probes: LineClient | None,
        budget: Budget,
        *,
        celery: CeleryPeer | None = None,
        rq: RQPeer | None = None,
    ):
        self.ls = lakeshore
        self.raw = raw
        self.pc = procrastinate
        self.celery = celery  # the peers on Redis (celery_driver.py, rq_driver.py)
        self.rq = rq
        self.probes = probes  # django_probes.py, once the HTTP rows are done
        self.budget = budget
        self._floor: dict[str, float] | None = None  # floor_figures, once measured
        self.batch_size = budget.batch_sizes[-1]
        self.list_rows = 0
        self.cursor: dict[str, object] = {}  # per system: the keyset cursor at depth
        # procrastinate end to end, per concurrency: each configuration's figures
        self.pc_configs: dict[int, dict[str, list[float]]] = {}

    def _runs(self, **by_system: Callable[[], float]) -> dict[str, Callable[[], float]]:
        """The measurements of the systems present (procrastinate, Celery and RQ may be
        missing)."""
        names = {
            "lakeshore": LAKESHORE,
            "raw": RAW,
            "procrastinate": PROCRASTINATE,
            "celery": CELERY,
            "rq": RQ,
        }
        runs = {names[key]: run for key, run in by_system.items()}
        for system, driver in ((PROCRASTINATE, self.pc), (CELERY, self.celery), (RQ, self.rq)):
            if driver is None:
                runs.pop(system, None)
        return runs

    def sections(self) -> list[Section]:
        return [
            self._submit(),
            self._claim_complete(),
            self._door(),
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
                    "submit one at a time (HTTP POST · defer · INSERT · apply_async · enqueue)",
                    JOBS_PER_S,
                    True,
                    self._runs(
                        lakeshore=self.lakeshore_submit_one,
                        raw=self.raw_submit_one,
                        procrastinate=lambda: self.pc.rate("defer_one", seconds=b.submit_seconds),
                        celery=lambda: self.celery.submit_one(b.submit_seconds),
                        rq=lambda: self.rq.submit_one(b.submit_seconds),
                    ),
                    floor=lambda: (self._floor or {}).get("lakeshore_floor"),
                ),
                Row(
                    "batch",
                    "batch submit (HTTP list · batch_defer · INSERT … SELECT unnest · group "
                    "· enqueue_many)",
                    JOBS_PER_S,
                    True,
                    self._runs(
                        lakeshore=self.lakeshore_batch,
                        raw=self.raw_batch,
                        procrastinate=lambda: self.pc.rate(
                            "batch_defer", size=self.batch_size, seconds=b.batch_seconds
                        ),
                        celery=lambda: self.celery.batch(
                            min(self.batch_size, b.celery_group), b.batch_seconds
                        ),
                        rq=lambda: self.rq.batch(self.batch_size, b.batch_seconds),
                    ),
                ),
            ],
            prepare=self.find_batch_size,
            finish=self.reset_all,
            key="submit",
        )
        section.notes.append(lambda: f"batches of {self.batch_size:,} per request/call")
        if self.celery is not None or self.rq is not None:
            section.notes.append(self.submit_peers)
        section.notes.append(self.submit_floor)
        section.rows[0].why = self.submit_why
        return section

    def submit_peers(self) -> str:
        """How Celery and RQ submit, as a note."""
        group = min(self.batch_size, self.budget.celery_group)
        return (
            "Celery and RQ (on the bench's Redis: see the end-to-end notes) submit from this "
            "process: Celery's apply_async one at a time, and a group of "
            f"{group:,} sent with one apply_async (a group publishes one message a task, "
            f"so a larger one only takes longer: batches of {group:,} keep its rounds "
            "within the budget), from an app with no result backend (no worker runs, "
            "nothing waits for a result); RQ's enqueue one at a time, and enqueue_many of "
            f"{self.batch_size:,} jobs (one pipeline)"
        )

    def submit_why(self) -> str:
        """Where the floor under one submit over HTTP stands, measured now."""
        floor = self.floor_figures()
        if "defer" not in floor:
            return "the floor under it was not measured (no procrastinate)"
        return (
            f"the floor of this server and client (the same gunicorn and httpx client, a "
            f"bare INSERT and no Django: bench/compare/floor_app.py) is "
            f"{floor['floor_defer']:.2f}× defer in this run, and Lakeshore's submit "
            f"{floor['lakeshore_floor']:.2f}× that floor (the note under the table)"
        )

    def submit_floor(self) -> str:
        """The floor under "submit one at a time", as a note (floor_figures)."""
        floor = self.floor_figures()
        runs = 4 if "defer" in floor else 3
        text = (
            f"the floor of one submit over HTTP, measured now ({self.budget.rounds} rounds, "
            f"each taking the {runs} in turn; medians, and ratios as the median of the "
            "rounds' ratios): under Lakeshore's gunicorn configuration, from the same httpx "
            f"client, a hello world answers {floor['hello']:,.0f} POSTs/s; the submit's own "
            "INSERT without Django (bench/compare/floor_app.py) "
            f"{floor['floor']:,.0f} jobs/s"
        )
        if "defer" in floor:
            text += (
                f", {floor['floor_defer']:.2f}× defer ({floor['defer']:,.0f} jobs/s in "
                "the same rounds)"
            )
        return text + (
            f"; Lakeshore's submit {floor['lakeshore']:,.0f} jobs/s, "
            f"{floor['lakeshore_floor']:.2f}× that floor"
        )

    def floor_figures(self) -> dict[str, float]:
        """The floor under "submit one at a time", measured once in this run: the same
        gunicorn configuration and httpx client, with a hello world and then with the
        submit's own INSERT but no Django (bench/compare/floor_app.py), in rounds with
        Lakeshore's own submit and procrastinate's defer, each round taking them in turn,
        so that the ratios compare figures of the same moments. Medians, and the
        medians of the rounds' ratios."""
        if self._floor is not None:
            return self._floor
        b = self.budget
        server, url = self.ls.serve("bench.compare.floor_app:application")
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

        floor = {name: median(name) for name in rates}
        floor["lakeshore_floor"] = paired("lakeshore", "floor")
        if "defer" in rates:
            floor["floor_defer"] = paired("floor", "defer")
        self._floor = floor
        return floor

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

    # ------------------------------------------------------------------ in-process probes

    def controller(self) -> list[Section]:
        """The controller's tick at each size, measured inside Django (django_probes.py),
        once the HTTP server is stopped: one section a size (each its own fleet)."""
        return [self._tick(queues) for queues in self.budget.tick_queues]

    def _tick(self, queues: int) -> Section:
        daemons = queues * self.budget.tick_daemons_per_queue
        row = Row(
            f"tick-{queues}",
            f"controller tick over {queues:,} queues × {daemons:,} daemons",
            "s",
            False,
            {LAKESHORE: lambda: self.probes.call("tick")["seconds"]},
            variant=f"{queues:,} queues",
        )
        section = Section(
            f"Controller (in-process, fleet.controller.tick(), simulated provider), "
            f"{queues:,} queues",
            [row],
            prepare=lambda: self.probes.call("tick_setup", queues=queues, daemons=daemons),
            finish=lambda: self.probes.call("tick_cleanup"),
            key="tick",
        )
        section.notes.append(
            "steady state: each queue at its fixed size, so a tick decides and launches "
            "and terminates nothing; the first round writes each queue's first event, "
            "later ones find nothing changed and write none (a sample per queue once a "
            "minute, when a round starts a new minute)"
        )
        return section

    def claim_kinds(self) -> list[str]:
        """The old per-kind claim figures of queue_bench.py (one run, not medians)."""
        seconds = self.budget.claim_kind_seconds
        return self.probes.call("claim_kinds", seconds=seconds)["lines"]
