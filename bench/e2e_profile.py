"""Where the time of an end-to-end run goes: a real `lakeshore daemon run` against the
bench's gunicorn (as bench/compare starts both), with the CPU each side used and,
optionally, py-spy profiles of the daemon and the server's workers.

    python -m bench.e2e_profile                       concurrency 1 and 8, pool and process
    python -m bench.e2e_profile --concurrency 8 --isolation pool --rounds 3
    python -m bench.e2e_profile --py-spy var/profile  py-spy records (collapsed stacks)
    python -m bench.e2e_profile --verbose             the daemon's debug log (claims, reports)

Each round: a daemon is started and registered, jobs are queued at once in one statement
(as the bench's end-to-end rows do) and the round is timed from the insert to the last
success. `--settle` seconds between the registration and the insert let the daemon warm
its slots first (the bench's rows start the clock at once: 0). Printed per round: jobs/s,
and the CPU seconds per thousand jobs of the daemon itself, its job processes, the
server's processes and PostgreSQL's, over the same interval."""

import argparse
import contextlib
import os
import subprocess
import time
from pathlib import Path

import psutil

from bench.compare.infra import BIN, RUN_DIR, Postgres, stop_process, tree_cpu_seconds
from bench.compare.rowkit import outcomes, wait_until
from bench.compare.systems import Lakeshore

QUEUE = "e2e"


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of one process (0 once it is gone)."""
    with contextlib.suppress(psutil.Error):
        times = psutil.Process(pid).cpu_times()
        return times.user + times.system
    return 0.0


def postgres_cpu(pgdata: Path) -> float:
    """CPU seconds of the PostgreSQL server's processes (the postmaster's children)."""
    pid = int((pgdata / "postmaster.pid").read_text().split()[0])
    return tree_cpu_seconds(pid)


class Round:
    """One timed run of `jobs` jobs through one daemon."""

    def __init__(self, ls: Lakeshore, pg: Postgres, args: argparse.Namespace):
        self.ls = ls
        self.pg = pg
        self.args = args

    def run(self, concurrency: int, isolation: str, label: str) -> dict:
        args = self.args
        self.ls.reset()
        name = f"profile-c{concurrency}-{isolation}"
        flags = ["--verbose"] if args.verbose else []
        os.environ["BENCH_DAEMON_FLAGS"] = " ".join(flags)
        daemon = self.ls.start_daemon(
            queue=QUEUE, concurrency=concurrency, isolation=isolation, name=name
        )
        spies: list[subprocess.Popen] = []
        try:
            self.ls.wait_registered(name, daemon)
            time.sleep(args.settle)
            spies = self._spy(daemon.pid, label) if args.py_spy else []
            before = self._cpu(daemon.pid)
            started = time.perf_counter()
            self.ls.fill(QUEUE, args.jobs, analyze=False)
            wait_until(lambda: self.ls.count(QUEUE, "succeeded") >= args.jobs, args.seconds)
            took = time.perf_counter() - started
            after = self._cpu(daemon.pid)
            done = self.ls.count(QUEUE, "succeeded")
        finally:
            for spy in spies:
                spy.send_signal(2)  # py-spy writes its record on SIGINT
            for spy in spies:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    spy.wait(30)
            stop_process(daemon)
            self.ls.reset()
        per_k = {part: (after[part] - before[part]) * 1000 / max(done, 1) for part in before}
        return {"rate": done / took, "done": done, "took": took, **per_k}

    def _cpu(self, daemon_pid: int) -> dict[str, float]:
        own = process_cpu(daemon_pid)
        return {
            "daemon": own,
            "jobs": tree_cpu_seconds(daemon_pid) - own,
            "server": self.ls.server_cpu_seconds(),
            "postgres": postgres_cpu(self.pg.pgdata),
        }

    def _spy(self, daemon_pid: int, label: str) -> list[subprocess.Popen]:
        """py-spy records of the daemon (its threads; idle ones with --idle) and of each server
        worker, as collapsed stacks (`--format raw`: flamegraph.pl's input)."""
        out = Path(self.args.py_spy)
        out.mkdir(parents=True, exist_ok=True)
        workers = psutil.Process(self.ls.server.pid).children()
        targets = [("daemon", daemon_pid)] + [(f"server{i}", w.pid) for i, w in enumerate(workers)]
        spies = []
        for who, pid in targets:
            command = [str(BIN / "py-spy"), "record", "--pid", str(pid), "--threads"]
            command += ["--idle"] if self.args.idle else []
            command += ["--gil"] if self.args.gil else []
            command += ["--rate", str(self.args.rate), "--format", "raw", "--nonblocking"]
            command += ["--output", str(out / f"{label}-{who}.txt")]
            log = open(out / f"{label}-{who}.log", "wb")  # noqa: SIM115 - the spy's own
            spies.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
        time.sleep(1.0)  # py-spy attaches
        return spies


def exchange_cost(ls: Lakeshore, pg: Postgres, limit: int, exchanges: int) -> dict:
    """Server and PostgreSQL CPU per exchange of `limit` outcomes and a claim of `limit`,
    from one client speaking as a daemon (no job run): the fixed cost of a request and
    the cost of each job in it, apart from the daemon's."""
    ls.reset()
    ls.fill(QUEUE, limit * (exchanges + 2), analyze=False)
    with ls.client("daemon") as client:
        daemon_id = ls.register(client, f"cost-{limit}", QUEUE)
        url = f"/api/v1/daemons/{daemon_id}/exchange/"
        held = outcomes(
            client.post(url, json={"limit": limit}).raise_for_status().json()["claimed"]
        )
        server, postgres = ls.server_cpu_seconds(), postgres_cpu(pg.pgdata)
        started = time.perf_counter()
        for _ in range(exchanges):
            answer = client.post(url, json={"outcomes": held, "limit": limit})
            held = outcomes(answer.raise_for_status().json()["claimed"])
        took = time.perf_counter() - started
    ls.reset()
    return {
        "ms": took * 1000 / exchanges,
        "server": (ls.server_cpu_seconds() - server) * 1000 / exchanges,
        "postgres": (postgres_cpu(pg.pgdata) - postgres) * 1000 / exchanges,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, action="append")
    parser.add_argument("--isolation", choices=["pool", "process"], action="append")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settle", type=float, default=0.0)
    parser.add_argument("--py-spy", metavar="DIR")
    parser.add_argument("--idle", action="store_true", help="py-spy samples idle threads too")
    parser.add_argument("--gil", action="store_true", help="py-spy samples the GIL's holder only")
    parser.add_argument("--rate", type=int, default=100, help="py-spy's samples a second")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument(
        "--exchange-cost",
        metavar="LIMITS",
        help="instead: server CPU per exchange of N outcomes + a claim of N, e.g. 1,8,50",
    )
    args = parser.parse_args()
    pg = Postgres()
    pg.start()
    ls = Lakeshore(pg)
    try:
        ls.setup()
        if args.exchange_cost:
            for limit in [int(n) for n in args.exchange_cost.split(",")]:
                for _ in range(args.rounds):
                    got = exchange_cost(ls, pg, limit, max(20, 2000 // limit))
                    print(
                        f"exchange of {limit}: {got['ms']:.1f} ms; CPU ms per exchange: "
                        f"server {got['server']:.2f}, postgres {got['postgres']:.2f}",
                        flush=True,
                    )
            return
        profile = Round(ls, pg, args)
        for round_no in range(1, args.rounds + 1):
            for concurrency in args.concurrency or [1, 8]:
                for isolation in args.isolation or ["pool", "process"]:
                    label = f"c{concurrency}-{isolation}-r{round_no}"
                    got = profile.run(concurrency, isolation, label)
                    print(
                        f"{label}: {got['rate']:7.1f} jobs/s "
                        f"({got['done']} in {got['took']:.2f} s); "
                        f"CPU s per 1,000 jobs: daemon {got['daemon']:.2f}, job processes "
                        f"{got['jobs']:.2f}, server {got['server']:.2f}, "
                        f"postgres {got['postgres']:.2f}",
                        flush=True,
                    )
        print(f"daemon logs: {RUN_DIR / 'log'}")
    finally:
        ls.close()
        pg.stop()


if __name__ == "__main__":
    main()
