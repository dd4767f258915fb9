"""The "N idle daemons" rows: a fleet of simulated daemons (bench/fleet_swarm.py, in one
or a few processes of their own) sending what `lakeshore daemon run` sends when idle,
against the bench's Lakeshore server, measured window by window:

    server CPU          the server's processes' CPU time (/proc), % of one core
    heartbeat p99       the latency of the heartbeats sent, from send to answer (an idle
                        daemon whose poll was answered within the interval skips its
                        heartbeat: lakeshore.worker.heartbeat.claims_renew)
    liveness p99        the age of the daemons' heartbeats as the server sees them (what
                        the reaper compares with the timeout: a parked daemon is renewed
                        by the server), p99 over the daemons (each one's newest live
                        row), the highest of the window's looks (every 2 s)
    submit to claim     jobs submitted one at a time while the fleet idles: from the
                        submit's answer to the claim answer that carries the job
    daemons lost        daemons the server marked lost, by the window's end (the reaper
                        runs every LAKESHORE_TICK_SECONDS meanwhile, as Celery beat does)
    polls held          polls the server let wait (not refused with Retry-After) and
                        answered within their wait (+ 2 s), % of the polls sent

bench/compare/scale_rows.py makes the rows; `make bench` and `python -m bench.compare fleet`
run them."""

import json
import os
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field

from bench.compare.infra import BIN, ROOT, RUN_DIR, progress, stop_process, tree_cpu_seconds
from bench.compare.lines import LineClient
from bench.compare.systems import Lakeshore
from bench.fleet_swarm import percentile

STARTUP = 3.0  # seconds a generator process takes to import and start its daemons
SETTLE = 10.0  # seconds after the whole fleet registered before the first window
UP_WITHIN = 180.0  # seconds past the planned ramp the fleet may take to come up
METRICS = ("cpu", "heartbeat", "liveness", "submit", "lost", "held")


@dataclass
class FleetResult:
    daemons: int
    processes: int
    window: float  # seconds
    windows: list[dict] = field(default_factory=list)  # the merged figures, per window
    registered: int = 0
    up_after: float = 0.0  # seconds from the first daemon's start until all had registered
    ramp: float = 0.0  # the planned ramp (seconds)
    unclaimed: int = 0  # submitted jobs no claim answer carried
    early: int = 0  # jobs claimed before their submit's answer arrived (timed from its send)
    # Rows no daemon knew of: a register whose answer timed out (the daemon registered
    # again, as `lakeshore daemon run` does), silent from the start.
    orphans_lost: int = 0
    lost_at_end: int = 0
    heartbeat_interval: float = 0.0
    claim_wait: float = 0.0
    taken: dict[str, int] = field(default_factory=dict)  # metric → windows handed out
    warm_errors: dict[str, int] = field(default_factory=dict)  # during the ramp and settling
    drain_errors: dict[str, int] = field(default_factory=dict)  # as the daemons stopped

    def next(self, metric: str) -> float | None:
        """The metric's figure for the next round: window by window; daemons lost: the
        whole run's, every round (a count that only grows has no median of windows).
        Heartbeat latency: None (no figure) in a window in which no heartbeat was sent."""
        if metric == "lost":
            return self.lost_at_end
        index = self.taken.get(metric, 0)
        self.taken[metric] = index + 1
        value = self.windows[min(index, len(self.windows) - 1)][metric]
        if value is None and metric != "heartbeat":
            raise RuntimeError(f"no {metric} figure in window {index + 1}")
        return value

    def summary(self) -> str:
        per = "; ".join(
            f"window {i + 1}: {w['sent']:,} polls sent, {w['answered']:,} of them answered "
            f"({w['held_count']:,} held and answered in time, {w['refused']:,} refused with "
            f"Retry-After, {w['late']:,} late), {w['unanswered']:,} never answered; "
            f"{w['beats']:,} heartbeats sent (p50 {_ms(w['beat_p50'])}), {w['skipped']:,} "
            f"skipped (a poll answered within the interval), {w['gaps']:,} gaps between "
            f"renewals (p50 {w['gap_p50']:.1f} s), longest silence {w['silence']:.1f} s, "
            f"submit to claim p50 {_ms(w['submit_p50'])} over {w['submits']} (the submit's "
            f"own answer p50 {_ms(w['submit_answer_p50'])}), "
            f"{w['lost']} daemon rows lost by its end, "
            f"generator CPU {w['generator_cpu']:.0f} % of a core, load average "
            f"{w['load']:.1f}, "
            f"errors {_errors(w['errors'])}"
            for i, w in enumerate(self.windows)
        )
        return (
            f"the fleet was up (every daemon registered) {self.up_after:.0f} s after it "
            f"started (the ramp planned {self.ramp:.0f} s), the first window {SETTLE:g} s "
            "later; "
            f"{self.registered:,} registrations of {self.daemons:,} daemons "
            f"({self.processes} generator process(es)); each claims with wait "
            f"{self.claim_wait:g} s and heartbeats every {self.heartbeat_interval:g} s (the "
            f"daemon's own defaults and rule); {per}; {self.unclaimed} submitted jobs never "
            f"claimed, {self.early} claimed before their submit's answer arrived (timed from "
            f"the submit's send instead); errors before the first window (the ramp and "
            f"settling): {_errors(self.warm_errors)}; after the last window each daemon "
            "stopped as at its first SIGTERM (its drain answers its waiting poll; errors: "
            f"{_errors(self.drain_errors)}); {self.lost_at_end} daemons lost when the "
            f"generators stopped, and {self.orphans_lost} rows of "
            "registrations whose answer never arrived (the daemon registered again)"
        )

    def explain(self, metric: str) -> str:
        """What this run's own figures say about a target on `metric` it missed."""
        w = self.windows
        refused = sum(x["refused"] for x in w)
        late = sum(x["late"] + x["unanswered"] for x in w)
        errors = _errors(_sum_errors(w))
        generator = max(x["generator_cpu"] for x in w)
        requests = sum(x["answered"] + x["beats"] + x["submits"] for x in w)
        seconds = self.window * len(w)
        cpu = statistics.median(x["cpu"] for x in w)
        per_request = 10 * cpu * seconds / requests if requests else 0.0  # ms
        load = (
            f"the server at {cpu:.0f} % of a core, the generator at up to "
            f"{generator:.0f} %; errors: {errors}"
        )
        return {
            "cpu": f"{requests / seconds:,.0f} requests a second (polls, heartbeats, "
            f"submits), about {per_request:.1f} ms of server CPU each; {refused:,} of the "
            "polls were refused a wait (Retry-After) and came back",
            "heartbeat": (
                f"heartbeats took p50 {_ms(statistics.median(_p50s(w, 'beat_p50')))} with {load}"
                if any(x["beats"] for x in w)
                else f"no daemon sent one: each idle daemon's poll renewed it "
                f"({sum(x['skipped'] for x in w):,} heartbeats skipped, the daemon's rule); "
                "see liveness for how fresh the server saw them"
            ),
            "liveness": f"the oldest heartbeat {max(x['oldest'] for x in w):.1f} s; gaps "
            f"between a daemon's answered polls p50 "
            f"{statistics.median(_p50s(w, 'gap_p50')):.1f} s, the longest "
            f"{max(x['silence'] for x in w):.1f} s; {refused:,} polls refused a wait "
            f"(Retry-After), {late:,} answered late or not at all; {load}",
            "submit": f"submit to claim p50 {_ms(statistics.median(_p50s(w, 'submit_p50')))}; "
            f"{self.unclaimed} never claimed; {refused:,} polls refused a wait (a daemon "
            f"sleeping out Retry-After hears of no job); {load}",
            "lost": f"the longest silence of a daemon was "
            f"{max(x['silence'] for x in w):.1f} s; {load}",
            "held": f"{refused:,} polls refused a wait (Retry-After: the server's waits were "
            f"full), {late:,} answered late or not at all; errors: {errors}",
        }[metric]


def _p50s(windows: list[dict], key: str) -> list[float]:
    return [w[key] for w in windows if w[key] is not None] or [float("nan")]


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:,.0f} ms"


def _sum_errors(windows: list[dict]) -> dict[str, int]:
    total: dict[str, int] = {}
    for window in windows:
        for kind, n in window["errors"].items():
            total[kind] = total.get(kind, 0) + n
    return total


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{n:,} {kind}" for kind, n in sorted(errors.items())) or "none"


class Reaper:
    """fleet.daemons.reap() every LAKESHORE_TICK_SECONDS in a Django process of its own
    (django_probes.py), as `make run`'s Celery beat and worker do; the bench's server
    runs no beat."""

    def __init__(self, lakeshore: Lakeshore):
        self.probes = LineClient(
            [str(BIN / "python"), "-m", "bench.compare.django_probes"],
            cwd=ROOT,
            env=lakeshore.env,
            log=RUN_DIR / "log" / "fleet-reaper.log",
        )
        self.every = float(self.probes.call("tick_seconds")["seconds"])
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(self.every):
            self.probes.call("reap")

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(30)
        self.probes.close()


def run_fleet(
    lakeshore: Lakeshore,
    *,
    daemons: int,
    processes: int,
    windows: int,
    window: float,
    submits: int,
    ramp_per_second: float,
    queue: str = "idle",
) -> FleetResult:
    """Start the fleet, sample the server at each window's edges, merge what each
    generator prints, and end the fleet's daemons (terminated, with a wake-up)."""
    lakeshore.reset()
    ramp = max(5.0, daemons / ramp_per_second)
    started = time.monotonic()
    start_file = RUN_DIR / "fleet-start.json"
    start_file.unlink(missing_ok=True)
    result = FleetResult(daemons, processes, window, ramp=ramp)
    share = -(-daemons // processes)
    generators = []
    reaper = Reaper(lakeshore)
    try:
        for first in range(0, daemons, share):
            args = {
                "base": lakeshore.base_url,
                "token": lakeshore.tokens["daemon"],
                "operator": lakeshore.tokens["operator"],
                "daemons": min(share, daemons - first),
                "first": first,
                "queue": queue,
                "ramp": ramp,
                "start_file": str(start_file),
                "windows": windows,
                "window": window,
                "submits": submits,
            }
            generator = subprocess.Popen(
                [str(BIN / "python"), "-m", "bench.fleet_swarm"],
                cwd=ROOT,
                env=lakeshore.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=open(RUN_DIR / "log" / f"fleet-{first}.log", "wb"),  # noqa: SIM115
                text=True,
            )
            generator.stdin.write(json.dumps(args))
            generator.stdin.close()
            generators.append(generator)
        progress(f"  {daemons:,} daemons: ramp {ramp:.0f} s, then {windows} × {window:.0f} s")
        up = _fleet_up(lakeshore, daemons, started + STARTUP + ramp + UP_WITHIN)
        result.up_after = up - started - STARTUP
        start_at = max(started + STARTUP + ramp, up) + SETTLE
        written = start_file.with_suffix(".tmp")
        written.write_text(json.dumps({"start_at": start_at}))
        written.rename(start_file)  # the generators count their windows from it
        progress(f"  the fleet is up after {result.up_after:.0f} s; the windows follow")
        samples = _sample(lakeshore, generators, start_at, windows, window)
        outputs = []
        for generator in generators:
            out = generator.stdout.read()  # it stops by itself after its last window
            if generator.wait(60):
                raise RuntimeError(f"a fleet generator failed; see {RUN_DIR / 'log'}")
            outputs.append(json.loads(out))
    finally:
        for generator in generators:
            stop_process(generator)
        reaper.close()
    known = [int(i) for out in outputs for i in out["ids"]]
    result.lost_at_end = _lost(lakeshore, known)
    result.orphans_lost = _lost(lakeshore) - result.lost_at_end
    _merge(result, outputs, samples, start_at, window)
    lakeshore.sql("UPDATE fleet_daemon SET state = 'terminated' WHERE name LIKE 'fleet-%'")
    lakeshore.sql("SELECT pg_notify('lakeshore_work', %s)", [queue])
    time.sleep(1)
    lakeshore.reset()
    return result


def _fleet_up(lakeshore: Lakeshore, daemons: int, deadline: float) -> float:
    """When (time.monotonic()) every fleet daemon has registered: the windows measure an
    idle fleet, not one still coming up (a server slower to register than the ramp
    would have the ramp's tail in its first window). At the deadline, whatever is up."""
    query = "SELECT count(*) FROM fleet_daemon WHERE name LIKE %s AND state <> 'terminated'"
    while time.monotonic() < deadline:
        if lakeshore.sql(query, ["fleet-%"])[0][0] >= daemons:
            return time.monotonic()
        time.sleep(0.5)
    return time.monotonic()


def _lost(lakeshore: Lakeshore, ids: list[int] | None = None) -> int:
    """Fleet daemons the server marks lost: of `ids` only, if given."""
    query = "SELECT count(*) FROM fleet_daemon WHERE state = 'lost' AND name LIKE %s"
    if ids is None:
        return lakeshore.sql(query, ["fleet-%"])[0][0]
    return lakeshore.sql(query + " AND id = ANY(%s)", ["fleet-%", ids])[0][0]


def _sample(lakeshore, generators, start_at: float, windows: int, window: float) -> list:
    """(server CPU s, generators' CPU s, daemons lost, moment, the machine's load average,
    the ages of the daemons' heartbeats as the server sees them: p99 and longest, sampled
    every AGE_EVERY seconds since the previous edge) at each window's edge."""
    samples = []
    for edge in range(windows + 1):
        ages = []
        while (left := start_at + edge * window - time.monotonic()) > 0:
            time.sleep(min(left, AGE_EVERY))
            if edge:
                ages.append(_ages(lakeshore))
        generator_cpu = sum(tree_cpu_seconds(g.pid) for g in generators)
        samples.append(
            (
                lakeshore.server_cpu_seconds(),
                generator_cpu,
                _lost(lakeshore),
                time.monotonic(),
                os.getloadavg()[0],
                ages,
            )
        )
    return samples


AGE_EVERY = 2.0  # seconds between two looks at the fleet's heartbeat ages


def _ages(lakeshore) -> tuple[float, float]:
    """(p99, longest) of the fleet daemons' heartbeat ages, in seconds: what the
    reaper compares with LAKESHORE_HEARTBEAT_TIMEOUT. Of each daemon's newest live row
    only: an older one of its name is a registration whose answer never reached it (it
    registered again, as the daemon does), which no daemon renews; the note counts
    those ("rows of registrations whose answer never arrived") and the reaper ends them."""
    (row,) = lakeshore.sql(
        """SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY age), max(age)
             FROM (SELECT DISTINCT ON (name)
                          extract(epoch FROM now() - last_heartbeat_at)::float AS age
                     FROM fleet_daemon
                    WHERE name LIKE %s AND state IN ('idle', 'busy', 'draining')
                    ORDER BY name, id DESC) a""",
        ["fleet-%"],
    )
    return (row[0] or 0.0, row[1] or 0.0)


def _merge(result: FleetResult, outputs: list[dict], samples, start_at, window) -> None:
    submits: list[dict] = []
    claimed: dict[str, float] = {}
    for out in outputs:
        submits += out["submits"]
        claimed.update(out["claimed"])
        result.registered += out["registered"]
        result.heartbeat_interval = out["heartbeat_interval"]
        result.claim_wait = out["claim_wait"]
        for kind, n in out["warm"]["errors"].items():
            result.warm_errors[kind] = result.warm_errors.get(kind, 0) + n
        for kind, n in out["drain_errors"].items():
            result.drain_errors[kind] = result.drain_errors.get(kind, 0) + n
    # By the window it was sent in: from its answer to its claim's answer; a submit never
    # answered, or never claimed before the fleet stopped, counts as infinitely late.
    waits: list[list[float]] = [[] for _ in range(len(samples) - 1)]
    answers: list[list[float]] = [[] for _ in range(len(samples) - 1)]
    for submit in submits:
        index = min(int((submit["sent"] - start_at) // window), len(waits) - 1)
        if submit["answered"] is not None:
            answers[index].append(submit["answered"] - submit["sent"])
        if submit["id"] in claimed:
            took = claimed[submit["id"]] - submit["answered"]
            if took < 0:  # its claim's answer came first: from the submit's send, then
                result.early += 1
                took = claimed[submit["id"]] - submit["sent"]
            waits[index].append(took)
        else:
            result.unclaimed += 1
            waits[index].append(float("inf"))
    for i, (before, after) in enumerate(zip(samples, samples[1:], strict=False)):
        parts = [out["windows"][i] for out in outputs]
        seconds = after[3] - before[3]
        beats = [b for part in parts for b in part["beats"]]
        gaps = [g for part in parts for g in part["gaps"]]
        sent = sum(p["sent"] for p in parts)
        held = sum(p["held"] for p in parts)
        p99 = percentile(beats, 99)
        result.windows.append(
            {
                "sent": sent,
                "answered": sum(p["answered"] for p in parts),
                "held_count": held,
                "late": sum(p["late"] for p in parts),
                "unanswered": sum(p["unanswered"] for p in parts),
                "refused": sum(p["refused"] for p in parts),
                "errors": _sum_errors(parts),
                "beats": len(beats),
                "beat_p50": statistics.median(beats) if beats else None,
                "skipped": sum(p["skipped"] for p in parts),
                "gaps": len(gaps),
                "gap_p50": statistics.median(gaps) if gaps else float("nan"),
                "silence": max(p["silence"] for p in parts),
                "submits": len(waits[i]),
                "submit_p50": statistics.median(waits[i]) if waits[i] else None,
                "submit_answer_p50": statistics.median(answers[i]) if answers[i] else None,
                "generator_cpu": 100 * (after[1] - before[1]) / seconds,
                "load": after[4],
                "cpu": 100 * (after[0] - before[0]) / seconds,
                "heartbeat": None if p99 is None else p99 * 1000,
                # the server's view: the p99 heartbeat age, the highest of the window's looks
                "liveness": max((p99 for p99, _ in after[5]), default=float("inf")),
                "oldest": max((oldest for _, oldest in after[5]), default=float("inf")),
                # No submit sent in the window: the one before it was still unanswered.
                "submit": _p99_ms(waits[i]) if waits[i] else float("inf"),
                "lost": after[2],
                "held": 100 * min(held, sent) / sent if sent else None,
            }
        )


def _p99_ms(values: list[float]) -> float | None:
    found = percentile(values, 99)
    return None if found is None else found * 1000
