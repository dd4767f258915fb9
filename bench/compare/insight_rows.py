"""The insight rows (issue 31): what ended in a window (GET …/stats/?window=, through
jobs/insight.py) and the jobs list's search (GET /api/v1/jobs/?search=, through the
trigram index inv_search), over HTTP, on a table of finished rows at each of
`insight_sizes`. Lakeshore alone: raw SQL and procrastinate have no such feature.

The newest rows are the same at every size: `insight_hour_rows` ended in the last hour
and `insight_day_rows` in the last 24 hours (the hour's included); the rest ended in
the 30 days before that day. From one size to the next only the table grows, never
the windows, so a figure that grows with the size follows the table and one that
stays follows the window. The rows are written in the order they ended, so ids grow
with time as they do in a live table. The searches look for a rare text, a common one,
one common in the table but absent from its newer part (a function retired a month
ago), and a common one among the failures (state=failed).

Each size is filled afresh by INSERT … SELECT generate_series in chunks, on LANES
connections at once (a bulk load uses every core; each row's id is its number g, so ids
still grow with time whichever lane wrote it), the secondary indexes of the old rows
built after them, LANES at once too; the old rows
are then vacuumed (as autovacuum would have done long ago), the last day's only
analysed (as a live table's newest rows are). Once measured, every statement on
jobs_invocation that each request runs is explained (EXPLAIN (ANALYZE, BUFFERS),
through the views themselves in django_probes.py) into the run's log directory, and
the indexes each one read are named in a note."""

import queue
import re
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from bench.compare.infra import ROOT, RUN_DIR, progress
from bench.compare.report import SectionResult, number, times
from bench.compare.rowkit import LAKESHORE, Budget, Row, Section, median_ms, run_threads
from bench.compare.systems import Lakeshore

QUEUES = 4  # the rows are dealt over insight-0 … insight-3 in turn
STATS_QUEUE = "insight-0"
FILL_CHUNK = 250_000
LANES = 2  # connections filling, and building indexes, at once: one a core
RARE_ROWS = 6  # failed rows whose error says RARE_TEXT, spread over the old rows
RARE_TEXT = "checksum mismatch"
COMMON_TEXT = "bad shard 17"  # one of the 20 errors: a twentieth of the failures
# The oldest tenth of the rows ran a function none has run since (RETIRED_TEXT): common
# in the table, absent from its newer part.
RETIRED_SHARE = 10
RETIRED_TEXT = "legacy_sync"
FAILED_TEXT = "billing"  # a quarter of the functions
PAGE = 50  # the search's page (limit)

# Where each part of the table ended, before the moment it is written: the hour's rows
# end within its last 40 minutes, and the day's before the hour starts, so that for 20
# minutes after the fill each window holds exactly its rows.
HOUR = (timedelta(minutes=40), timedelta(0))
DAY = (timedelta(hours=23, minutes=40), timedelta(hours=1))
OLD = (timedelta(days=31), timedelta(days=1))

# One segment's rows, numbered g: its outcome by g (5 % failed with one of 20
# tracebacks, and the rare one every rare_every rows; 1 % timed out; 2 % killed, half of
# those before they started), a few hundred functions (the retired one up to row
# retired_until), a key on one row in ten; finished_at = start + (g - first) × step.
_FILL_SQL = r"""
INSERT INTO jobs_invocation (id, queue, function, args, kwargs, priority, state, attempts,
        max_attempts, timeout_s, key, reason, error, created_at, started_at, finished_at)
SELECT g, 'insight-' || g %% 4,
       CASE WHEN g <= %(retired_until)s THEN 'ledger.tasks.legacy_sync'
            ELSE (ARRAY['reports.tasks.build_', 'billing.tasks.charge_', 'mail.tasks.send_',
                        'export.tasks.dump_'])[1 + k %% 4] || k / 4 END,
       '[]', '{}', 0,
       CASE fate WHEN 'rare' THEN 'failed' WHEN 'cancelled' THEN 'killed' ELSE fate END,
       CASE fate WHEN 'cancelled' THEN 0 ELSE 1 END,
       1, 300,
       CASE WHEN g %% 10 = 9 THEN 'order-' || g ELSE '' END,
       CASE fate WHEN 'cancelled' THEN 'bulk-cancel'
                 WHEN 'killed' THEN 'killed by an operator' ELSE '' END,
       CASE fate
         WHEN 'rare' THEN E'Traceback (most recent call last):\n'
              || E'  File "/srv/app/ledger/archive.py", line 211, in verify\n'
              || E'    raise LedgerError(f"checksum mismatch in archive {n}")\n'
              || 'LedgerError: checksum mismatch in archive ' || g
         WHEN 'failed' THEN E'Traceback (most recent call last):\n'
              || '  File "/srv/app/reports/tasks.py", line ' || 40 + shard
              || E', in build\n    rows = load_shard(shard)\n'
              || E'  File "/srv/app/reports/shards.py", line 88, in load_shard\n'
              || E'    raise ShardError(shard)\n'
              || (ARRAY['ValueError', 'KeyError', 'LookupError', 'RuntimeError'])[1 + shard %% 4]
              || ': bad shard ' || shard
         WHEN 'timeout' THEN 'exceeded timeout_s (300 s)'
         ELSE '' END,
       finished - ran - waited,
       CASE fate WHEN 'cancelled' THEN NULL ELSE finished - ran END,
       finished
  FROM (SELECT g, k, shard, fate, finished,
               CASE fate WHEN 'timeout' THEN interval '300 s'
                         WHEN 'cancelled' THEN interval '0'
                         ELSE g %% 1000 * interval '37 ms' END AS ran,
               g / 1000 %% 50 * interval '100 ms' AS waited
          FROM (SELECT g, g / 7 %% 300 AS k, g / 100 %% 20 AS shard,
                       %(start)s + (g - %(first)s) * %(step)s AS finished,
                       CASE WHEN g %% NULLIF(%(rare_every)s, 0) = %(rare_every)s / 2
                              THEN 'rare'
                            WHEN g %% 100 < 5 THEN 'failed'
                            WHEN g %% 100 = 5 THEN 'timeout'
                            WHEN g %% 100 = 6 THEN 'cancelled'
                            WHEN g %% 100 = 7 THEN 'killed'
                            ELSE 'succeeded' END AS fate
                  FROM generate_series(%(low)s::bigint, %(high)s::bigint) g) AS numbered) AS timed
"""

# The table's indexes besides those behind a constraint (the primary key): what the
# fill of the old rows drops and builds again after them, as a bulk load does.
_SECONDARY_INDEXES_SQL = """
SELECT index_class.relname, pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class index_class ON index_class.oid = i.indexrelid
 WHERE i.indrelid = 'jobs_invocation'::regclass
   AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
 ORDER BY index_class.relname
"""

_SEARCHED_SQL = """
SELECT count(*) FROM jobs_invocation
 WHERE upper(function || ' ' || key || ' ' || error_headline) LIKE '%%' || upper(%s) || '%%'
   AND (%s::text IS NULL OR state = %s::text)
"""

_SCAN = re.compile(
    r"(Index Only Scan|Index Scan|Bitmap Index Scan|Seq Scan)(?: Backward)? (?:using|on) (\w+)"
)
_ROWS = re.compile(r"actual time=[\d.]+\.\.[\d.]+ rows=([\d.]+)")
_HEAP_FETCHES = re.compile(r"Heap Fetches: (\d+)")
_EXECUTION = re.compile(r"Execution Time: ([\d.]+) ms")


@dataclass(frozen=True)
class Probe:
    """One measured request: what it asks, and what a right answer holds."""

    key: str
    label: str
    path: str
    window: str = ""  # a stats request's answer block (last_hour, last_day)
    queue: str | None = None  # a stats request's queue (None: the fleet)
    search: str = ""
    state: str | None = None


PROBES = (
    Probe(
        "queue-1h",
        "queue stats, last hour",
        f"/api/v1/queues/{STATS_QUEUE}/stats/?window=1h",
        window="last_hour",
        queue=STATS_QUEUE,
    ),
    Probe(
        "queue-24h",
        "queue stats, last 24 hours",
        f"/api/v1/queues/{STATS_QUEUE}/stats/?window=24h",
        window="last_day",
        queue=STATS_QUEUE,
    ),
    Probe("fleet-1h", "fleet stats, last hour", "/api/v1/stats/?window=1h", window="last_hour"),
    Probe(
        "search-rare",
        f"search '{RARE_TEXT}' (a handful of matches), {PAGE} a page",
        f"/api/v1/jobs/?search={quote(RARE_TEXT)}&limit={PAGE}",
        search=RARE_TEXT,
    ),
    Probe(
        "search-common",
        f"search '{COMMON_TEXT}' (thousands of matches), {PAGE} a page",
        f"/api/v1/jobs/?search={quote(COMMON_TEXT)}&limit={PAGE}",
        search=COMMON_TEXT,
    ),
    Probe(
        "search-retired",
        f"search '{RETIRED_TEXT}' (a tenth of the table, none in its newer part), {PAGE} a page",
        f"/api/v1/jobs/?search={quote(RETIRED_TEXT)}&limit={PAGE}",
        search=RETIRED_TEXT,
    ),
    Probe(
        "search-failed",
        f"search '{FAILED_TEXT}' and state=failed, {PAGE} a page",
        f"/api/v1/jobs/?search={quote(FAILED_TEXT)}&state=failed&limit={PAGE}",
        search=FAILED_TEXT,
        state="failed",
    ),
)


@dataclass(frozen=True)
class Segment:
    """Rows first..last (their g), ending from `start` a `step` apart."""

    first: int
    last: int
    start: datetime
    step: timedelta
    rare_every: int = 0  # a rare row every this many (0: none)
    retired_until: int = 0  # the rows up to this one ran the retired function


class InsightTable:
    """The insight sections, one a size; the table is filled afresh for each."""

    def __init__(self, lakeshore: Lakeshore, budget: Budget):
        self.ls = lakeshore
        self.budget = budget
        self.expected: dict[str, int] = {}  # per probe key: rows ended, or matches
        self.filled: dict[int, str] = {}  # per size: how long the fill took
        self.explained: dict[int, dict[str, str]] = {}  # per size, per probe key

    def sections(self) -> list[Section]:
        return [self._section(size) for size in self.budget.insight_sizes]

    def _section(self, size: int) -> Section:
        b = self.budget
        rows = [
            Row(
                f"insight-{size}-{probe.key}",
                f"{probe.label}, {size:,} finished rows",
                "ms",
                False,
                {LAKESHORE: lambda p=probe: self.measure(p)},
                variant=f"{size:,} rows",
            )
            for probe in PROBES
        ]
        section = Section(
            f"Stats and search at {size:,} finished rows (GET …/stats/ · GET …/jobs/?search=)",
            rows,
            prepare=lambda: self.fill(size),
            finish=lambda: self.explain(size),
            key="insight",
        )
        section.notes += [
            f"the same windows at every size: {b.insight_hour_rows:,} rows ended in the last "
            f"hour and {b.insight_day_rows:,} in the last 24 hours (the hour's included), "
            f"the rest of the {size:,} over the 30 days before that day, so what differs "
            "from one size to the next is the table, not the window: a figure that grows "
            "with the size follows the table; 5 % failed (20 tracebacks), 1 % timed out, "
            "2 % killed; the oldest tenth ran a function none has run since "
            f"('{RETIRED_TEXT}'); {QUEUES} queues, the rows dealt in turn (queue stats: "
            f"{STATS_QUEUE}); each answer checked (the window's count, the page's length)",
            f"median of {b.insight_samples} requests a round (fewer if they take over 2 s: "
            "at least 3), each the whole request",
            lambda: self.filled.get(size, "not filled"),
            lambda: self._plans_note(size),
        ]
        return section

    # ------------------------------------------------------------------ the table

    def fill(self, size: int) -> None:
        """`size` finished rows, the oldest first, in chunks; what each probe should find."""
        b = self.budget
        with self.ls.client() as client:
            for i in range(QUEUES):
                answer = client.post("/api/v1/queues/", json={"name": f"insight-{i}"})
                if answer.status_code not in (201, 409):
                    answer.raise_for_status()
        self.ls.reset()
        old_end = size - b.insight_day_rows
        day_end = size - b.insight_hour_rows
        if old_end < 1:
            raise ValueError(f"{size:,} rows cannot hold the last day's {b.insight_day_rows:,}")
        started = time.perf_counter()
        oldest = Segment(
            1,
            old_end,
            *self._span(OLD, old_end),
            rare_every=old_end // RARE_ROWS,
            retired_until=size // RETIRED_SHARE,
        )
        indexes = self.ls.sql(_SECONDARY_INDEXES_SQL)
        for name, _ in indexes:  # a bulk load: the old rows first, their indexes after
            self.ls.sql(f'DROP INDEX "{name}"')
        try:
            self._write(oldest, size)
        finally:
            build_started = time.perf_counter()
            # The trigram index takes the longest: first, so the other lane builds the rest.
            builds = sorted(indexes, key=lambda index: " gin " not in index[1].lower())
            self._in_lanes(
                [(f"building {name}", definition, None) for name, definition in builds],
                setup=f"SET maintenance_work_mem = '{512 // LANES}MB'",
            )
            built = time.perf_counter() - build_started
        vacuum_started = time.perf_counter()
        self.ls.sql("VACUUM ANALYZE jobs_invocation")
        vacuumed = time.perf_counter() - vacuum_started
        self._write(Segment(old_end + 1, day_end, *self._span(DAY, day_end - old_end)), size)
        self._write(Segment(day_end + 1, size, *self._span(HOUR, size - day_end)), size)
        self.ls.sql(  # the ids were given: the next row made takes the one after
            "SELECT setval(pg_get_serial_sequence('jobs_invocation', 'id'), %s)", [size]
        )
        self.ls.sql("ANALYZE jobs_invocation")
        took = time.perf_counter() - started
        table = self.ls.sql("SELECT pg_size_pretty(pg_total_relation_size('jobs_invocation'))")
        self.filled[size] = (
            f"filled in {took:,.0f} s ({size / took:,.0f} rows/s), the rows before the last "
            f"day with the secondary indexes dropped and built after them in {built:,.0f} s "
            f"(a bulk load), then {vacuumed:,.0f} s of VACUUM ANALYZE, then the last day's "
            f"rows inserted with every index in place; the table with its indexes: "
            f"{table[0][0]}"
        )
        progress(f"  {self.filled[size]}")
        self._expect(size, old_end=old_end, day_end=day_end)

    @staticmethod
    def _span(edges: tuple[timedelta, timedelta], rows: int) -> tuple[datetime, timedelta]:
        """The first row's end and the step between rows, for `rows` rows between
        `edges` (how long before now the part starts and ends)."""
        since, until = edges
        return datetime.now(UTC) - since, (since - until) / rows

    def _write(self, segment: Segment, size: int) -> None:
        chunks = []
        for low in range(segment.first, segment.last + 1, FILL_CHUNK):
            high = min(low + FILL_CHUNK - 1, segment.last)
            params = {
                "low": low,
                "high": high,
                "first": segment.first,
                "start": segment.start,
                "step": segment.step,
                "rare_every": segment.rare_every,
                "retired_until": segment.retired_until,
            }
            chunks.append((f"rows {low:,}–{high:,} of {size:,}", _FILL_SQL, params))
        self._in_lanes(chunks)

    def _in_lanes(self, statements: list[tuple[str, str, dict | None]], setup: str = "") -> None:
        """Run (label, sql, params) statements on LANES connections of their own, each
        lane taking the next statement as it finishes one, in the order given; each
        statement's end is reported. Raises the first failure, once every lane stopped."""
        todo: queue.SimpleQueue = queue.SimpleQueue()
        for statement in statements:
            todo.put(statement)
        failed = threading.Event()  # one lane failed: the others start nothing more

        def lane() -> None:
            try:
                with self.ls.pg.connect(self.ls.database) as conn:
                    if setup:
                        conn.execute(setup)
                    while not failed.is_set():
                        try:
                            label, sql, params = todo.get_nowait()
                        except queue.Empty:
                            return
                        started = time.perf_counter()
                        conn.execute(sql, params)
                        took = time.perf_counter() - started
                        progress(f"  insight fill: {label} ({took:,.1f} s)")
            except BaseException:
                failed.set()
                raise

        run_threads([lane] * min(LANES, len(statements)))

    def _expect(self, size: int, *, old_end: int, day_end: int) -> None:
        """What each probe should find: the rows ended in its window, or its matches."""

        def of_queue(first: int, last: int) -> int:  # g ≡ 0 (mod QUEUES), first..last
            return last // QUEUES - (first - 1) // QUEUES

        self.expected = {
            "queue-1h": of_queue(day_end + 1, size),
            "queue-24h": of_queue(old_end + 1, size),
            "fleet-1h": size - day_end,
        }
        for probe in PROBES:
            if probe.search:
                found = self.ls.sql(_SEARCHED_SQL, [probe.search, probe.state, probe.state])
                self.expected[probe.key] = found[0][0]

    # ------------------------------------------------------------------ measuring

    def measure(self, probe: Probe) -> float:
        with self.ls.client() as client:
            return median_ms(
                lambda: self._check(probe, client.get(probe.path).raise_for_status().json()),
                self.budget.insight_samples,
            )

    def _check(self, probe: Probe, answer) -> None:
        """Raise unless the answer holds what the table says it should."""
        expected = self.expected[probe.key]
        if probe.window:
            block = answer[probe.window]
            got = sum(block[state] for state in ("succeeded", "failed", "killed", "timeout"))
            if got != expected:
                raise RuntimeError(
                    f"{probe.window} holds {got:,} ended, not {expected:,} (the window "
                    "moved past the rows written for it: too long since the fill)"
                )
        elif len(answer) != min(expected, PAGE):
            raise RuntimeError(f"{len(answer)} rows on the page; {expected:,} match")

    # ------------------------------------------------------------------ the plans

    def explain(self, size: int) -> None:
        """EXPLAIN (ANALYZE, BUFFERS) of every statement on jobs_invocation of each
        request, into the log directory; the last size then empties the table."""
        probes = self.ls.probes("insight-probes")
        try:
            answer = probes.call(
                "explain", paths=[p.path for p in PROBES], token=self.ls.tokens["operator"]
            )
        finally:
            probes.close()
            if size == self.budget.insight_sizes[-1]:
                self.ls.reset()
        out = RUN_DIR / "log" / f"insight-explain-{size}.txt"
        text: list[str] = []
        summaries: dict[str, str] = {}
        for probe in PROBES:
            statements = answer["plans"][probe.path]
            text += [f"==== {probe.label}: GET {probe.path}", ""]
            for statement in statements:
                text += [statement["sql"], "", statement["plan"], ""]
            summaries[probe.key] = "; ".join(_summary(s["plan"]) for s in statements)
        out.write_text("\n".join(text))
        self.explained[size] = summaries
        progress(f"  the plans: {out.relative_to(ROOT)}")

    def _plans_note(self, size: int) -> str:
        summaries = self.explained.get(size)
        if summaries is None:
            return "the plans: not explained"
        counts = ", ".join(
            f"'{p.search}'{' failed' if p.state else ''} {self.expected.get(p.key, 0):,}"
            for p in PROBES
            if p.search
        )
        lines = "; ".join(f"**{p.label}**: {summaries[p.key]}" for p in PROBES)
        return (
            f"matches at this size: {counts}. What each request's statements on "
            "jobs_invocation read (EXPLAIN (ANALYZE, BUFFERS) once, after the rounds; in "
            f"full in var/bench-run/log/insight-explain-{size}.txt): {lines}"
        )

    # ------------------------------------------------------------------ by size

    def by_size(self, sections: list[SectionResult]) -> list[str]:
        """One line a probe, a column a size, and the largest size over the smallest."""
        sizes = self.budget.insight_sizes
        medians = {
            result.row.key: result.median(LAKESHORE)
            for section in sections
            for result in section.rows
            if result.row.key.startswith("insight-")
        }
        heads = [f"{size:,} rows" for size in sizes]
        if len(sizes) > 1:
            heads.append(f"{sizes[-1]:,} ÷ {sizes[0]:,}")
        lines = [f"| ms ↓ | {' | '.join(heads)} |", "|---|" + "---:|" * len(heads)]
        for probe in PROBES:
            figures = [medians.get(f"insight-{size}-{probe.key}") for size in sizes]
            cells = [number(figure) for figure in figures]
            if len(sizes) > 1:
                first, last = figures[0], figures[-1]
                cells.append(times(last / first if first and last is not None else None))
            lines.append(f"| {probe.label} | {' | '.join(cells)} |")
        return lines


def _summary(plan: str) -> str:
    """The scans of one plan (index, rows, heap fetches) and its execution time."""
    scans = []
    for line in plan.splitlines():
        found = _SCAN.search(line)
        if found is None:
            continue
        rows = _ROWS.search(line)
        counted = f" ({float(rows.group(1)):,.0f} rows)" if rows else ""
        scans.append(f"{found.group(1)} {found.group(2)}{counted}")
    fetches = sum(int(n) for n in _HEAP_FETCHES.findall(plan))
    executed = _EXECUTION.search(plan)
    took = f"{float(executed.group(1)):.1f} ms" if executed else "?"
    heap = f", {fetches:,} heap fetches" if fetches else ""
    return f"{' + '.join(scans) or 'no scan'} [{took}{heap}]"
