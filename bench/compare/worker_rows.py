"""The rows of the daemon's side: claim + complete over HTTP (no job run) against raw
SQL, and end to end (a real `lakeshore daemon run` against procrastinate's worker, in
its two configurations, Celery's worker in its two (the pool rows) and RQ's workers (the
process rows)). A mixin of Rows (rows.py), whose state it uses."""

import time
from collections.abc import Callable

import httpx

from bench.compare.infra import stop_process
from bench.compare.rowkit import (
    JOBS_PER_S,
    LAKESHORE,
    RAW,
    RAW_CLAIM,
    RAW_FINISH,
    Row,
    Section,
    outcomes,
    throughput,
    wait_until,
)
from bench.compare.systems import PRINTER


class WorkerRows:
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
                    # Celery's prefork pool keeps its processes: the pool's peer
                    runs["celery"] = lambda c=concurrency: self.celery.e2e(
                        c, self.budget.e2e_jobs, self.budget.e2e_seconds
                    )
                if mode == "process":  # RQ forks a work horse per job: a process per job
                    runs["rq"] = lambda c=concurrency: self.rq.e2e(
                        c, self.budget.e2e_jobs, self.budget.e2e_seconds
                    )
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
        section = Section(
            "End to end (real daemon · procrastinate's worker · Celery's · RQ's)", rows, key="e2e"
        )
        section.notes.append(
            f"{b.e2e_jobs:,} no-op jobs queued at once in one statement, or "
            f"{b.e2e_seconds:.0f} s, whichever first; timed from the insert to the last "
            "success, each system's workers ready before it: Lakeshore's daemon registered, "
            "its job processes up (one a slot; process isolation: the job template, its "
            "modules imported) and idle in its first claim (Lakeshore.wait_ready); Celery's "
            "worker from its worker_ready signal; RQ's workers registered; procrastinate's "
            "0.5 s after its worker started; Lakeshore runs lakeshore.functions.echo "
            "through `lakeshore daemon run`, procrastinate, Celery and RQ a no-op task each "
            "(see below); the rows of jobs that print run "
            f"{PRINTER[0]}{tuple(PRINTER[1])} (100 lines, each flushed) instead, their "
            "output captured, shipped and stored per job"
        )
        if self.pc is not None:
            section.notes.append(self.procrastinate_configs)
        if self.celery is not None:
            section.notes.append(self.celery.notes)
        if self.rq is not None:
            section.notes.append(self.rq.notes)
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
            self.ls.wait_ready(name, daemon, concurrency=concurrency, isolation=isolation)
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
