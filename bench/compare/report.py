"""The measurements, summed up: medians, ratios, the issue's targets, and the Markdown
that `make bench` prints and writes to bench/results/latest.md."""

import statistics
from dataclasses import dataclass, field

from bench.compare.rowkit import CELERY, LAKESHORE, PEERS, PROCRASTINATE, RAW, RQ, SYSTEMS, Row


@dataclass
class RowResult:
    row: Row
    values: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def median(self, system: str) -> float | None:
        values = self.values.get(system)
        return statistics.median(values) if values else None

    def ratio(self, system: str, other: str) -> float | None:
        mine, theirs = self.median(system), self.median(other)
        return mine / theirs if mine is not None and theirs else None


@dataclass
class SectionResult:
    title: str
    rows: list[RowResult]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0  # its wall time, preparing and cleaning up included


@dataclass(frozen=True)
class Target:
    label: str
    row: str  # the key (or key prefix) of the rows with Lakeshore's figure
    goal: float
    against: str | None = None  # the peer's figure: this row's, else the first `against`
    stretch: float | None = None
    # With against=None, a bound on Lakeshore's figure: at most `goal` (at least, when
    # `higher`).
    higher: bool = False
    # A bound on Lakeshore's figure over raw SQL's in the same row: at most `goal` times.
    over_raw: bool = False
    exact: bool = False  # `row` is the key itself, not a prefix of keys
    peer: str = PROCRASTINATE  # whose figure `against` names
    # A bound on Lakeshore's figure over its own floor in the same run (Row.floor): at
    # most `goal` times (at least, when `higher`). Beside it, Lakeshore ÷ the system
    # `shown` names, in the words `shown` gives it: (system, words).
    over_floor: bool = False
    shown: tuple[str, str] | None = None


TARGETS = (
    Target(
        "end to end, concurrency 8, --isolation pool ≥ 1× Celery (its faster configuration)",
        "e2e-c8",
        1.0,
        "e2e-c8",
        exact=True,
        peer=CELERY,
    ),
    Target(
        "end to end, concurrency 8, --isolation pool ≥ 2× procrastinate (its faster "
        "configuration: expert, as a rule)",
        "e2e-c8",
        2.0,
        "e2e-c8",
        exact=True,
    ),
    Target(
        "end to end, concurrency 8, --isolation process ≥ 1× RQ",
        "e2e-c8-process",
        1.0,
        "e2e-c8-process",
        peer=RQ,
    ),
    Target(
        "end to end, concurrency 8, --isolation process ≥ 0.75× procrastinate (its faster "
        "configuration)",
        "e2e-c8-process",
        0.75,
        "e2e-c8",
    ),
    Target(
        "HTTP claim + complete, one daemon, limit 1 ≥ 0.3× procrastinate's worker at concurrency 1",
        "cc-1x1",
        0.3,
        "e2e-c1",
    ),
    Target("batch submit ≥ 0.5× batch_defer", "batch", 0.5, "batch"),
    Target(
        "one submit over HTTP ≥ 0.85× the HTTP floor of the same run (floor_app.py; "
        "beside it, Lakeshore ÷ defer)",
        "submit-one",
        0.85,
        higher=True,
        over_floor=True,
        shown=(PROCRASTINATE, "defer"),
    ),
    Target("5,000 idle daemons: server CPU ≤ 25 % of one core", "fleet-cpu-5000", 25.0),
    Target("idle daemons: heartbeat latency p99 ≤ 1 s (those sent)", "fleet-heartbeat", 1000.0),
    Target("idle daemons: none marked lost", "fleet-lost", 0.0),
    Target("idle daemons: submit to claim p99 ≤ 100 ms", "fleet-submit", 100.0),
    Target(
        "idle daemons: every poll held (no Retry-After) and answered within its wait",
        "fleet-held",
        100.0,
        higher=True,
    ),
    Target("two-server wake-up p99 ≤ 100 ms", "two-server-p99", 100.0),
    Target("controller tick over 1,000 queues × 10,000 daemons ≤ 1 s", "tick-1000", 1.0),
    Target("controller tick over 10,000 queues × 100,000 daemons ≤ 10 s", "tick-10000", 10.0),
    Target(
        "bulk-cancel 100,000 queued ≤ 1.3× the same UPDATE on Lakeshore's own table "
        "(beside it, Lakeshore ÷ raw SQL's UPDATE on its table)",
        "bulk-cancel",
        1.3,
        over_floor=True,
        shown=(RAW, "raw SQL's UPDATE"),
    ),
)


def number(value: float | None) -> str:
    if value is None:
        return "—"
    if float(value).is_integer() and abs(value) < 100:  # a count: 0 daemons, not 0.00
        return f"{value:.0f}"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def times(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 10:
        return f"{value:,.0f}×"
    return f"{value:.2f}×" if value >= 0.1 else f"{value:.2g}×"


def _matches(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + "-")


def _cell(result: RowResult, system: str) -> str:
    if system in result.errors:
        return "error"
    return number(result.median(system))


RATIOS = (*PEERS, RAW)  # the columns of Lakeshore ÷ another system


def table(sections: list[SectionResult]) -> list[str]:
    over = " | ".join(f"Lakeshore ÷ {other}" for other in RATIOS)
    lines = [
        f"| | unit | {' | '.join(SYSTEMS)} | {over} |",
        "|---|---|" + "---:|" * (len(SYSTEMS) + len(RATIOS)),
    ]
    for section in sections:
        lines.append(f"| **{section.title}** |" + " |" * (len(SYSTEMS) + len(RATIOS) + 1))
        for result in section.rows:
            row = result.row
            arrow = "↑" if row.higher_is_better else "↓"
            cells = [_cell(result, system) for system in SYSTEMS]
            ratios = [times(result.ratio(LAKESHORE, other)) for other in RATIOS]
            lines.append(f"| {row.label} | {row.unit} {arrow} | {' | '.join(cells + ratios)} |")
    return lines


def targets(sections: list[SectionResult]) -> list[str]:
    results = [result for section in sections for result in section.rows]
    lines = ["| target | measured | result |", "|---|---:|---|"]
    for target in TARGETS:
        mine = [
            r
            for r in results
            if (r.row.key == target.row if target.exact else _matches(r.row.key, target.row))
        ]
        if not mine:
            lines.append(f"| {target.label} | — | not measured |")
        for result in mine:
            label = target.label
            if len(mine) > 1:
                label += f" ({result.row.variant or result.row.label})"
            lines.append(f"| {label} | {_judge(target, result, results)} |")
    return lines


def _judge(target: Target, result: RowResult, results: list[RowResult]) -> str:
    value = result.median(LAKESHORE)
    if target.over_floor:
        ratio = result.row.floor() if result.row.floor else None
        if ratio is None:
            return "— | not measured"
        met = ratio >= target.goal if target.higher else ratio <= target.goal
        beside = result.ratio(LAKESHORE, target.shown[0]) if target.shown else None
        shown = f" ({times(beside)} {target.shown[1]})" if beside is not None else ""
        why = result.row.why() if not met and result.row.why else ""
        verdict = "met" if met else f"not met{': ' + why if why else ''}"
        return f"{times(ratio)}{shown} | {verdict}"
    if target.over_raw:
        ratio = result.ratio(LAKESHORE, RAW)
        if ratio is None:
            return "— | not measured"
        why = result.row.why() if ratio > target.goal and result.row.why else ""
        verdict = "met" if ratio <= target.goal else f"not met{': ' + why if why else ''}"
        return f"{times(ratio)} | {verdict}"
    if target.against is None:  # an absolute bound
        if value is None:
            why = result.row.why() if result.row.why else ""
            return f"— | not measured{': ' + why if why else ''}"
        met = value >= target.goal if target.higher else value <= target.goal
        why = result.row.why() if not met and result.row.why else ""
        verdict = "met" if met else f"not met{': ' + why if why else ''}"
        return f"{number(value)} {result.row.unit} | {verdict}"
    theirs = result.median(target.peer)
    if theirs is None:
        theirs = next(
            (
                r.median(target.peer)
                for r in results
                if _matches(r.row.key, target.against) and r.median(target.peer)
            ),
            None,
        )
    if value is None or not theirs:
        return "— | not measured"
    ratio = value / theirs
    why = result.row.why() if ratio < target.goal and result.row.why else ""
    verdict = "met" if ratio >= target.goal else f"not met{': ' + why if why else ''}"
    if target.stretch is not None:
        reached = "met" if ratio >= target.stretch else "not met"
        verdict += f" (stretch {target.stretch:g}×: {reached})"
    return f"{times(ratio)} | {verdict}"


def _borrow(sections: list[SectionResult]) -> None:
    """Rows measured against another row's procrastinate run take its figures."""
    results = {result.row.key: result for section in sections for result in section.rows}
    for result in results.values():
        source = results.get(result.row.procrastinate_from or "")
        if source is not None and PROCRASTINATE in source.values:
            result.values[PROCRASTINATE] = source.values[PROCRASTINATE]


# Found with cProfile (Django's test client against the bench database, 500 requests a
# path) and timed over HTTP (one httpx client, keep-alive, gunicorn as `make bench` runs
# it), on this 2-core machine; written down here so the table's figures have their why.
PROFILED = [
    "- **The keep-alive stall** (40–45 ms a request under runserver: small writes and a "
    "delayed ACK) is gone under gunicorn, which writes each response at once.",
    "- **Submit one**: 4 statements (queue lookup, BEGIN, INSERT, COMMIT) became 1 "
    "(INSERT … SELECT … WHERE the queue admits work, RETURNING *); the careful path runs only "
    "when nothing was inserted (an unknown, closed or bounded queue, a key taken). DRF built "
    "the output serializer's 20 fields on every response (~1 ms): built once per class now, "
    "rendered through a plan (same output, tested). 5.4 → 2.5 ms a request over HTTP.",
    "- **Claim + complete**: 9 round trips became 6: a queue's row (kind, temperature) is "
    "reused for 2 s while its state is checked inside the claim statement, the daemon "
    "lookup loads no provider, and an empty claim touches its daemon only when the "
    "heartbeat is due. 12.4 → 7.7 ms a pair. The daemon now reports what ended with its "
    "next claim (`…/exchange/`): one request per job instead of two.",
    "- **Batch submit** (10,000): the INSERT returns the rows (no second SELECT), queue names "
    "are checked once per process, and the answer renders through the plan: 1.52 → 0.91 s "
    "in process.",
    "- **The lean path** (`edge/lean_path.py`): the daemon protocol and submit "
    "skip the 13 middlewares and DRF's dispatch (same answers, bodies and headers: tested "
    "request by request against the full stack); input is validated without building DRF "
    "serializers (`lean_input.py`, checked equal to DRF on generated input); raw rows "
    "become model instances without RawQuerySet's per-query setup (`rows.py`); the daemon "
    "is read with one plain SELECT; the pool checks a connection by its socket instead of "
    "a round trip (`dbpool.py`); an exchange rewrites its daemon's row once, not twice. "
    "Server CPU over HTTP, one client: exchange 6.9 → 4.3 ms, submit 3.3 → 2.4 ms; a "
    "10,000-item batch in process 1.38 → 0.97 s.",
    "- **A claim's plan**: with statistics saying most rows are queued (a backlog just "
    "filled), the planner walked the primary key from the table's first row through every "
    "finished one (2,200 finished: 1.2 ms a claim, growing as the queue drains). The claim "
    "now starts at the queued rows' first id, read from their own index: 0.6 ms, flat. "
    "The redundant index on the daemon column (inv_daemon_id covers it) is gone: one "
    "index write fewer per insert, claim and completion.",
    "- **The daemon's row**: every claim marked its daemon busy (with its current job) and "
    "every completion marked it idle, each a statement of its own and a write of the row "
    "(0.6–0.9 ms each). A claim now marks its daemon busy inside the claim statement, and "
    "only when it was not busy; a completion writes nothing while work is queued for the "
    "daemon (its next claim follows); idle comes back with the next claim that finds "
    "nothing, or the heartbeat. A daemon working through a backlog writes its row only "
    "with its heartbeat. Claim, then complete, one daemon, limit 1: 8.8 → 6.4 ms a pair in "
    "process; 69 → 82–93 jobs/s over HTTP in three runs (0.22× → 0.25–0.31× of the worker "
    "at concurrency 1).",
    "- **The connection pool's return**: its reset callback (which only noted the time) made "
    "psycopg_pool hand every returned connection to its worker thread, a thread switch "
    "under the GIL at the end of every request before the connection was free again. The "
    "check now notes the loan instead. One client submitting over HTTP, alternating runs: "
    "320–364 → 378–454 requests/s, server CPU 1.5–1.75 → 1.2–1.4 ms a request.",
    "- **Prepared statements**: Django binds parameters on the client, so PostgreSQL "
    "parsed and planned the submit's INSERT … SELECT and the completion's UPDATE … FROM "
    "unnest on every call. Both now go through a server-binding cursor that prepares them "
    "once per pooled connection (`rows.py`): the INSERT alone 0.84 → 0.65 ms, a submit "
    "through the lean path in process 1.41 → 1.15 ms. The claim stays client-bound: a "
    "generic plan would not see the queue's statistics (see the claim's plan above).",
    "- **What is left**: the submit section's note measures the floor under that row in "
    "the same run, round by round with Lakeshore's submit and `defer`: Lakeshore's "
    "gunicorn configuration and the same httpx client serving a hello world, then the "
    "submit's own INSERT with no Django at all (`floor_app.py`: no token, no validation, "
    "no model, no serializer, one connection per thread). In the run of this commit the "
    "hello world answered 1,085 POSTs/s (about what `defer` does), the floor 488 jobs/s "
    "(0.52× defer), and Lakeshore's submit 0.63× of that floor; in four runs the floor "
    "was 0.50–0.57× defer (in three: one took defer at another moment) and Lakeshore "
    "0.60–0.79× of it. So 0.5× defer is the floor of "
    "this server and client with a durable commit; the rest is Lakeshore's request path "
    "(its token, validation, rules, model and 20-field answer, Django's pooled connection "
    "and request signals: in process 1.6 million instructions a submit against the "
    "floor's 0.7 million). An idle long-poll cost about 3.1–3.5 ms of server CPU per "
    "answered wait under gunicorn's threads (three round trips: daemon, claim, commit); "
    "parked on the event loop it costs about 1.9 ms, one round trip (its daemon's row): "
    "a process that found the daemon's queues empty and has heard of nothing queued "
    "there since does not look again (jobs/wakeup.known_empty), and its worker threads "
    "take calls hot first (the thread that finished last: edge/threads.py; "
    "with the pool as before, which ran a steady load over all 128 threads in turn, "
    "5,000 idle daemons cost 8–9 % more).",
    "- **End to end**: the daemon claimed only for free slots, so each slot sat idle for a "
    "round trip after every short job (one daemon × 8 slots: 290 jobs/s). Its claim loop "
    "now runs on a thread of its own and, while jobs run under 0.1 s, claims ahead (as many "
    "more as its slots get through in about 50 ms): a freed slot starts its next job at "
    "once and each exchange carries every outcome of its round trip (290 → 520–860 jobs/s, "
    "half the server CPU a job). Two claims in flight, each for the free slots, was tried "
    "first and split the batches (80 jobs/s).",
    "- **End to end at concurrency 8, where the time goes** (`bench/e2e_profile.py`, py-spy "
    "of the daemon and each server worker, 3,000 jobs, pool): the daemon keeps one exchange "
    "in flight, and its claim thread spends 86 % of its time waiting for the answer; the "
    "server's worker is busy 63 % of the time, two thirds of it waiting on PostgreSQL (the "
    "completion's UPDATE, the claim, two commits); one exchange costs about 6.5 ms of server "
    "CPU and 4 ms of PostgreSQL's, plus 0.2 and 0.1 ms a job, of which statement execution "
    "is about 1 ms; the daemon holds its GIL about 20 % of the time, so the GIL is not the "
    "limit. In process isolation the jobs end one by one, and the claim went for the 1–5 "
    "that had just ended: an exchange every few jobs, about 2 ms of server CPU a job "
    "against 0.6 ms with the pool. While every slot has its next job waiting, a claim now "
    "waits for half the room (25 ms at most): the server's CPU a job went down by about a "
    "third and PostgreSQL's by a quarter. The daemon's spawner then waited for the job "
    "template's answer to each fork 78 % of its time (py-spy, --idle) while half the "
    "machine's CPU sat idle: the jobs handed out together now have their processes forked "
    "in one exchange (every request sent before the first answer is read; "
    "Pool.fork_ahead), 199–289 → 248–328 jobs/s in e2e_profile, interleaved. What bounds "
    "it now is the machine's CPU, most of it the kernel's: through the row both cores are "
    "95–97 % busy, 60 % of it system time (vmstat). perf and each process's own counts "
    "say where: a job process takes about 530 copy-on-write page faults (the template's "
    "pages its Python writes to, about 1.9 MB made its own) and its exit unmaps the rest, "
    "about 3 ms of CPU a job in all; the template takes about 130 faults a fork (the pages "
    "it writes to again after each one) and 1 ms of CPU; the daemon 0.9 ms. A second "
    "template forking in parallel measured the same (interleaved, 333–371 against "
    "295–371 jobs/s) and is not in this run, nor is the template setting up the job's "
    "output and logging before it forks (20 of the 530 faults). Forking ahead of the "
    "jobs still waiting for a slot, in "
    "batches of up to 8 off the start's path, measured the same and is not in this run. "
    "A second claim lane (an "
    "exchange while another is in flight) showed no gain against one, interleaved, and is "
    "not in this run.",
    "- **Bulk-cancel** (100,000 queued; database CPU from /proc, WAL from the LSN): each "
    "batch of 5,000 read the queued rows again from the first id, through every row the "
    "batches before it had killed (950,000 dead rows filtered in all), and shipped a row "
    "a job back to Python to count the queues: 1.4–1.5 s of database CPU against 0.85 s "
    "for one UPDATE. A batch now starts after the last id of the one before and answers "
    "its counts per queue from SQL (0.9 s). A killed row entered five indexes; "
    "inv_daemon_id now leaves out rows with no daemon and inv_finished killed rows, so it "
    "enters three (0.71 s, WAL 66 → 51 MB; 0.72 s and 56 MB with each batch's rows locked "
    "in id order first, so it cannot deadlock). Raw SQL's table has one index and a narrower "
    "row: one UPDATE of the same rows on Lakeshore's table is the floor (the note under "
    "the table), and the bulk-cancel runs at 1.2–1.3× it; 5.3× → 2.9× raw SQL in "
    "alternating runs. Batches of 2,000 to 25,000 cost the same.",
]


def render(
    sections: list[SectionResult],
    *,
    facts: list[str],
    skipped: list[str],
    extra: dict[str, list[str]],
) -> str:
    _borrow(sections)
    lines = ["# Lakeshore vs raw SQL, procrastinate, Celery and RQ (`make bench`)", ""]
    lines += [f"- {fact}" for fact in facts]
    lines += [
        "",
        "This machine is noisy (2 cores shared by the server, PostgreSQL, the clients and "
        "whatever else runs): the absolute figures are this run's only, and **only the "
        "ratios carry over** to another machine. Each cell is the median of the rounds, "
        "the systems taken in turn (round-robin, a different one first each round). "
        "↑: higher is better; ↓: lower is better (a ratio above 1 then means Lakeshore "
        "is slower). Raw SQL is the floor: the same work as bare statements.",
        "",
        *table(sections),
        "",
        "## Notes",
        "",
    ]
    for section in sections:
        for note in section.notes:
            lines.append(f"- {section.title}: {note}")
        for result in section.rows:
            for system, error in result.errors.items():
                lines.append(f"- **failed**: {result.row.label}, {system}: {error}")
    lines += [f"- **skipped**: {reason}" for reason in skipped]
    lines += ["", "## What profiling found, and what was removed", "", *PROFILED]
    for title, body in extra.items():
        lines += ["", f"## {title}", "", *body]
    lines += ["", "## Every round", ""]
    for section in sections:
        for result in section.rows:
            rounds = "; ".join(
                f"{system} " + ", ".join(number(v) for v in values)
                for system, values in result.values.items()
            )
            lines.append(f"- {result.row.label} ({result.row.unit}): {rounds or '—'}")
    lines += ["", "## Targets (from the issue)", "", *targets(sections)]
    lines += ["", "## Time per section", ""]
    lines += [f"- {section.title}: {section.seconds:,.0f} s" for section in sections]
    return "\n".join(lines) + "\n"
