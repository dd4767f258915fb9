"""The rows of the tables: bulk-cancel, and the jobs list at depth (HTTP against plain
SELECTs). A mixin of Rows (rows.py), whose state it uses."""

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
