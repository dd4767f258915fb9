"""The serving door's rows (issue 30): the same requests through the lean path
(edge/lean_path.py: the daemon protocol and submit without the middleware and DRF's
dispatch) and through the full framework (LAKESHORE_LEAN_PATH=0: the middleware, URL
resolving and the DRF view), both from the same event-loop door, on two servers of the
same configuration over the same database. Each round measures every pair back to back
(lean first in odd rounds, full first in even ones), so a pair's ratio compares figures
of the same moment; the note gives the median of the rounds' ratios. A mixin of Rows
(rows.py), whose claim and submit measurements it runs against each server in turn."""

import statistics
from collections.abc import Callable

from bench.compare.rowkit import JOBS_PER_S, LAKESHORE, Row, Section
from bench.compare.systems import stop_gunicorn

FULL_FRAMEWORK = {"LAKESHORE_LEAN_PATH": "0"}
WAYS = ("lean path", "full framework")


class DoorRows:
    def _door(self) -> Section:
        pairs: dict[str, tuple[str, Callable[[], float]]] = {
            "door-cc-1x1": (
                "claim + complete, 1 daemon, limit 1",
                lambda: self.lakeshore_claim_complete(1, 1),
            ),
            "door-exchange-1x1": (
                "claim + complete in one exchange, 1 daemon, limit 1",
                lambda: self.lakeshore_exchange(1, 1),
            ),
            "door-exchange-8x1": (
                "claim + complete in one exchange, 8 daemons, limit 1",
                lambda: self.lakeshore_exchange(8, 1),
            ),
            "door-submit-one": ("submit one at a time", self.lakeshore_submit_one),
        }
        self._door_pairs = pairs
        self._door_values: dict[tuple[str, str], list[float]] = {}
        rows = [
            Row(
                f"{key}-{'lean' if way == WAYS[0] else 'full'}",
                f"{label} · {way}",
                JOBS_PER_S,
                True,
                {LAKESHORE: self._door_figure(key, way)},
                variant=way,
            )
            for key, (label, _run) in pairs.items()
            for way in WAYS
        ]
        section = Section(
            "The serving door: the lean path against the full framework (issue 30)",
            rows,
            prepare=self._door_measure,
            finish=self.reset_all,
            key="door",
        )
        section.notes.append(
            "both from the event-loop door (edge/application.py) of the same gunicorn "
            "configuration, over the same database: the lean path as `make run` serves, the "
            "full framework on a second server with LAKESHORE_LEAN_PATH=0 (Django's "
            "middleware, URL resolving, DRF's view, parsers and serializers); each round "
            "measures each pair back to back, the order alternating"
        )
        section.notes.append(self._door_ratios)
        return section

    def _door_measure(self) -> None:
        """Every pair, round by round, each way in turn (the rows then read the figures)."""
        server, full_url = self.ls.serve(settings=FULL_FRAMEWORK)
        lean_url = self.ls.base_url
        urls = {WAYS[0]: lean_url, WAYS[1]: full_url}
        try:
            for turn in range(self.budget.rounds):
                for key, (_label, run) in self._door_pairs.items():
                    order = WAYS if turn % 2 == 0 else WAYS[::-1]
                    for way in order:
                        self.ls.base_url = urls[way]
                        try:
                            value = run()
                        finally:
                            self.ls.base_url = lean_url
                        self._door_values.setdefault((key, way), []).append(value)
        finally:
            stop_gunicorn(server)

    def _door_figure(self, key: str, way: str) -> Callable[[], float | None]:
        """The row's run: the next of the figures _door_measure took for it."""
        taken = iter(range(self.budget.rounds))

        def figure() -> float | None:
            values = self._door_values.get((key, way), [])
            index = next(taken, None)
            return values[index] if index is not None and index < len(values) else None

        return figure

    def _door_ratios(self) -> str:
        """Each pair's full framework ÷ lean path, the median of the rounds' ratios."""
        parts = []
        for key, (label, _run) in self._door_pairs.items():
            lean = self._door_values.get((key, WAYS[0]), [])
            full = self._door_values.get((key, WAYS[1]), [])
            if not lean or len(lean) != len(full):
                parts.append(f"{label}: not measured")
                continue
            ratio = statistics.median(f / b for f, b in zip(full, lean, strict=True))
            parts.append(f"{label}: {ratio:.2f}×")
        return "full framework ÷ lean path, jobs/s (median of the rounds' ratios): " + "; ".join(
            parts
        )
