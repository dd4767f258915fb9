"""The rows of the tables: bulk-cancel, and the jobs list at depth (HTTP against plain
SELECTs). A mixin of Rows (rows.py), whose state it uses."""

import statistics
import time

from bench.compare.rowkit import LAKESHORE, RAW, Row, Section, median_ms


class TableRows:
    # ------------------------------------------------------------------ bulk cancel

    def _bulk_cancel(self) -> Section:
        n = self.budget.cancel_rows
        row = Row(
            "bulk-cancel",
            f"bulk-cancel {n:,} queued (HTTP bulk-cancel · one UPDATE)",
            "s",
            False,
            self._runs(lakeshore=self.lakeshore_cancel, raw=self.raw_cancel),
            floor=lambda: self._cancel_floor_figures()[1] if self.cancel_floors else None,
        )
        self.cancel_floors: list[tuple[float, float]] = []  # (HTTP, one UPDATE) a round
        row.why = self.cancel_why
        section = Section("Bulk cancel", [row], finish=self.reset_all, key="cancel")
        section.notes.append(self.cancel_floor)
        return section

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
        self.cancel_floors.append((took, self.lakeshore_one_update()))
        return took

    def lakeshore_one_update(self) -> float:
        """The same rows and the same writes as the bulk-cancel's, in one UPDATE on
        Lakeshore's own table: no HTTP, no batches, no counts (the floor its schema
        sets: a killed row enters its primary key, inv_state_id and inv_queue_id)."""
        self.ls.reset()
        self.ls.fill("cancel", self.budget.cancel_rows)
        started = time.perf_counter()
        self.ls.sql(
            "UPDATE jobs_invocation SET state = 'killed', reason = 'bulk-cancel', "
            "finished_at = now(), scheduled_at = NULL WHERE queue = %s AND state = 'queued'",
            ["cancel"],
        )
        return time.perf_counter() - started

    def _cancel_floor_figures(self) -> tuple[float, float]:
        """The one UPDATE's median, and the median of the rounds' HTTP ÷ UPDATE."""
        floor = statistics.median(b for _, b in self.cancel_floors)
        return floor, statistics.median(a / b for a, b in self.cancel_floors)

    def cancel_why(self) -> str:
        if not self.cancel_floors:
            return "the floor on Lakeshore's own table was not measured"
        floor, paired = self._cancel_floor_figures()
        return (
            f"one UPDATE of the same rows on Lakeshore's own table takes {floor:.2f} s and "
            f"the bulk-cancel {paired:.2f}× that: a killed row enters three of its indexes "
            "(the primary key and the lists' by state and by queue) where raw SQL's table "
            "has one, and its row is wider (see the note under the table)"
        )

    def cancel_floor(self) -> str:
        if not self.cancel_floors:
            return "the floor on Lakeshore's own table: not measured"
        floor, paired = self._cancel_floor_figures()
        rounds = ", ".join(f"{a:.2f}/{b:.2f} s" for a, b in self.cancel_floors)
        return (
            "the floor on Lakeshore's own table, measured in each Lakeshore round just after "
            "its bulk-cancel: the same rows and writes in one UPDATE (no HTTP, no batches) "
            f"took {floor:.2f} s (median), and the HTTP bulk-cancel {paired:.2f}× that (the "
            f"median of the rounds' ratios; the rounds: {rounds}). Against raw SQL's table the "
            "rest is the schema: a killed row enters three indexes here (the primary key, "
            "inv_state_id, inv_queue_id) against one there, and its row is wider."
        )

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
