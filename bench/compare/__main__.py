"""`make bench`: Lakeshore against raw SQL and procrastinate on one PostgreSQL server
(var/pg-bench), and against Celery and RQ on one Redis server (var/bench-run/redis), in
one run. Prints a side-by-side table and writes it to bench/results/latest.md. Asserts
nothing.

    python -m bench.compare            the full run (its wall time: bench/results/latest.md)
    BENCH_QUICK=1 python -m bench.compare   one short round of every row (a smoke run,
        `make bench-quick`), written to var/bench-run/partial.md
    python -m bench.compare fleet two-server   only these sections (or BENCH_ONLY=fleet,…),
        printed and written to var/bench-run/partial.md (latest.md is left as the last full
        run wrote it); the keys: submit claim door e2e cancel lists fleet two-server tick
        claim-kinds insight, and controller (another name for tick: the controller's rows
        at 100, 1,000 and 10,000 queues). Sections that need no HTTP server (tick,
        claim-kinds) alone start none.
    BENCH_FLEET_SIZES=200,1000 …        the "N idle daemons" rows at these sizes
    BENCH_INSIGHT_SIZES=1000000 …       the stats and search rows at these table sizes

Modules: infra (paths, PostgreSQL, Redis, processes), systems (Lakeshore, raw SQL,
procrastinate), celery_driver and rq_driver (Celery and RQ, driven from this process;
what their workers import: celery_app, rq_job), rows (what each row measures),
scale_rows and fleet (the idle fleet, two servers; the fleet's generator is
bench/fleet_swarm.py), insight_rows (stats and search over a table of millions of
finished rows), report (medians, ratios, targets, Markdown), lines (the JSON-lines link
to helper processes), procrastinate_driver and django_probes (those helpers)."""

import dataclasses
import os
import platform
import sys
import time

from bench.compare import report, scale_rows
from bench.compare.celery_driver import CeleryPeer
from bench.compare.infra import RESULTS, ROOT, RUN_DIR, Postgres, Redis, progress, wall_seconds
from bench.compare.insight_rows import InsightTable
from bench.compare.lines import LineClient
from bench.compare.rowkit import Budget, Section
from bench.compare.rows import Rows
from bench.compare.rq_driver import RQPeer
from bench.compare.systems import Lakeshore, Procrastinate, RawSQL


def run_section(section: Section, rounds: int) -> report.SectionResult:
    """Each row's measurements, round by round, the systems in a rotated order."""
    started = time.monotonic()
    result = _run_section(section, rounds)
    result.seconds = time.monotonic() - started
    progress(f"  ({result.seconds:.0f} s)")
    return result


def _run_section(section: Section, rounds: int) -> report.SectionResult:
    progress(f"— {section.title}")
    results = [report.RowResult(row) for row in section.rows]
    try:
        if section.prepare:
            section.prepare()
    except Exception as exc:  # noqa: BLE001 - the row says so, the bench goes on
        progress(f"  preparing failed: {exc}")
        for result in results:
            result.errors = {system: f"preparing failed: {exc}" for system in result.row.runs}
        return report.SectionResult(section.title, results)
    try:
        for result in results:
            _measure(result, rounds)
    finally:
        if section.finish:
            try:
                section.finish()
            except Exception as exc:  # noqa: BLE001
                progress(f"  cleaning up failed: {exc}")
    notes = [note() if callable(note) else note for note in section.notes]
    return report.SectionResult(section.title, results, notes)


def _measure(result: report.RowResult, rounds: int) -> None:
    row = result.row
    systems = list(row.runs)
    for i in range(rounds):
        turn = i % len(systems)
        for system in systems[turn:] + systems[:turn]:
            if system in result.errors:
                continue
            try:
                value = row.runs[system]()
            except Exception as exc:  # noqa: BLE001 - recorded; the other systems go on
                result.errors[system] = f"{type(exc).__name__}: {exc}"
                progress(f"  {row.key} · {system}: FAILED {result.errors[system]}")
                continue
            if value is None:  # nothing to measure this round (no heartbeat sent): no figure
                progress(f"  {row.key} · round {i + 1}/{rounds} · {system}: no figure")
                continue
            result.values.setdefault(system, []).append(value)
            progress(
                f"  {row.key} · round {i + 1}/{rounds} · {system}: "
                f"{report.number(value)} {row.unit}"
            )


KEYS = (
    "submit",
    "claim",
    "door",
    "e2e",
    "cancel",
    "lists",
    "fleet",
    "two-server",
    "tick",
    "claim-kinds",
    "insight",
)
ALIASES = {"controller": "tick"}  # BENCH_ONLY=controller, as the controller's rows were run
IN_PROCESS = {"tick", "claim-kinds"}  # measured inside Django, with no HTTP server


def chosen() -> set[str]:
    """The sections asked for (arguments, else BENCH_ONLY); every one when none is."""
    names = sys.argv[1:] or [n for n in os.environ.get("BENCH_ONLY", "").split(",") if n]
    names = [ALIASES.get(name, name) for name in names]
    unknown = [name for name in names if name not in KEYS]
    if unknown:
        known = " ".join([*KEYS, *ALIASES])
        sys.exit(f"unknown section(s) {', '.join(unknown)}; the keys: {known}")
    return set(names or KEYS)


def main() -> None:
    quick = os.environ.get("BENCH_QUICK") == "1"
    budget = Budget.quick() if quick else Budget()
    if os.environ.get("BENCH_FLEET_SIZES"):
        sizes = tuple(int(n) for n in os.environ["BENCH_FLEET_SIZES"].split(","))
        budget = dataclasses.replace(budget, fleet_sizes=sizes)
    if os.environ.get("BENCH_INSIGHT_SIZES"):
        sizes = tuple(int(n) for n in os.environ["BENCH_INSIGHT_SIZES"].split(","))
        budget = dataclasses.replace(budget, insight_sizes=sizes)
    only = chosen()
    partial = only != set(KEYS)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RUN_DIR / "log").mkdir(parents=True, exist_ok=True)
    pg = Postgres()
    pg.start()
    lakeshore, raw = Lakeshore(pg), RawSQL(pg)
    procrastinate: Procrastinate | None = Procrastinate(pg)
    redis_server = Redis()
    celery: CeleryPeer | None = None
    rq: RQPeer | None = None
    probes: LineClient | None = None
    sections: list[report.SectionResult] = []
    skipped: list[str] = []
    extra: dict[str, list[str]] = {}
    pg_version = pg.version()
    try:
        if only <= IN_PROCESS:  # no HTTP server, no raw SQL table, no procrastinate
            progress(f"PostgreSQL {pg_version}: migrating the bench database")
            lakeshore.setup_database()
        else:
            progress(f"PostgreSQL {pg_version}: migrating, tokens, starting gunicorn")
            lakeshore.setup()
            raw.setup()
        if only & {"submit", "e2e"}:
            progress("procrastinate: its venv (var/bench-venv), database and schema")
            try:
                procrastinate.setup()
            except Exception as exc:  # noqa: BLE001 - the table goes on without it
                skipped.append(f"procrastinate ({exc}): its columns are empty")
                procrastinate.close()
                procrastinate = None
        else:  # none of the sections asked for has a procrastinate column
            procrastinate = None
        if only & {"submit", "e2e"}:
            progress("Celery and RQ: Redis (var/bench-run/redis)")
            try:
                redis_server.start()
                celery, rq = CeleryPeer(redis_server), RQPeer(redis_server)
                celery.setup()
                rq.setup()
            except Exception as exc:  # noqa: BLE001 - the table goes on without them
                skipped.append(f"Celery and RQ ({exc}): their columns are empty")
                celery = rq = None
        rows = Rows(lakeshore, raw, procrastinate, None, budget, celery=celery, rq=rq)
        insight = InsightTable(lakeshore, budget)
        for section in [
            *rows.sections(),
            *scale_rows.sections(lakeshore, budget),
            *insight.sections(),
        ]:
            if section.key in only:
                sections.append(run_section(section, budget.rounds))
        if "insight" in only:
            extra["Stats and search by table size (the same windows at each size)"] = (
                insight.by_size(sections)
            )
        lakeshore.stop_server()
        if only & {"tick", "claim-kinds"}:
            rows.probes = probes = lakeshore.probes()
        if "tick" in only:
            for section in rows.controller():
                sections.append(run_section(section, budget.rounds))
        if "claim-kinds" in only:
            progress("— claim per queue kind (queue_bench.py, in-process)")
            try:
                extra[
                    "Claim per queue kind (queue_bench.py: in-process service calls, one run)"
                ] = [f"    {line}" for line in rows.claim_kinds()]
            except Exception as exc:  # noqa: BLE001
                skipped.append(f"claim per queue kind: {exc}")
    finally:
        for closable in (probes, procrastinate, celery, rq, raw, lakeshore):
            if closable is not None:
                closable.close()
        redis_server.stop()
        pg.stop()
    facts = [
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        f"{os.cpu_count()} cores, Python {platform.python_version()}, "
        f"PostgreSQL {pg_version} (embedded, var/pg-bench), one database per system",
        "Lakeshore: in process only (django_probes.py), no HTTP server"
        if only <= IN_PROCESS
        else "Lakeshore: what `make run` serves, gunicorn with lakeshore_admin.gunicorn_conf "
        "(2 uvicorn worker processes serving the ASGI app: long-polls parked on the event "
        "loop, everything else on up to 128 threads a process), driven over HTTP keep-alive "
        "from this process; raw SQL: one table with a partial index, psycopg autocommit; "
        f"procrastinate {procrastinate.version if procrastinate else '—'} (var/bench-venv): "
        "its psycopg connector (pool of up to 10), a sync no-op task; end to end also as an "
        "expert runs it (a worker process a core, an async task, pools sized up front: the "
        "faster counts)",
        f"{budget.rounds} round(s) a row{' (BENCH_QUICK)' if quick else ''}; "
        f"wall time {wall_seconds():.0f} s",
    ]
    if celery is not None and rq is not None:
        facts.insert(
            -1,
            f"Celery {celery.version} and RQ {rq.version} on Debian's redis-server "
            f"{redis_server.version} (started by the bench: a unix socket, no persistence), "
            "driven from this process, their workers started for each measurement: "
            "Celery's prefork worker plain and tuned (the faster counts), RQ's default "
            "worker (a work horse forked per job)",
        )
    if partial:
        facts.append(f"only the sections {', '.join(sorted(only))} (a partial run)")
    text = report.render(sections, facts=facts, skipped=skipped, extra=extra)
    # Only the full run writes latest.md: a partial or quick one goes to the run's folder.
    out = RUN_DIR / "partial.md" if partial or quick else RESULTS / "latest.md"
    out.write_text(text)
    print("\n" + text)
    written = out.relative_to(ROOT)
    progress(f"written to {written}; wall time {wall_seconds():.0f} s")


if __name__ == "__main__":
    sys.exit(main())
