"""The measurements, summed up: medians, ratios, the issue's targets, and the Markdown
that `make bench` prints and writes to bench/results/latest.md."""

import statistics
from dataclasses import dataclass, field

from bench.compare.rows import LAKESHORE, PROCRASTINATE, RAW, SYSTEMS, Row


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


@dataclass(frozen=True)
class Target:
    label: str
    row: str  # the key (or key prefix) of the rows with Lakeshore's figure
    goal: float
    against: str | None = None  # procrastinate's figure: this row's, else the first `against`
    stretch: float | None = None  # None with against=None: Lakeshore's figure below `goal`


TARGETS = (
    Target("end to end, concurrency 8 ≥ 1× procrastinate", "e2e-c8", 1.0, "e2e-c8", stretch=2.0),
    Target(
        "HTTP claim + complete, one daemon, limit 1 ≥ 0.3× procrastinate's worker at concurrency 1",
        "cc-1x1",
        0.3,
        "e2e-c1",
    ),
    Target("batch submit ≥ 0.5× batch_defer", "batch", 0.5, "batch"),
    Target("one submit over HTTP ≥ 0.5× defer", "submit-one", 0.5, "submit-one"),
    Target("500 idle daemons < 5 % of one core", "idle", 5.0),
)


def number(value: float | None) -> str:
    if value is None:
        return "—"
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


def table(sections: list[SectionResult]) -> list[str]:
    lines = [
        f"| | unit | {' | '.join(SYSTEMS)} | Lakeshore ÷ procrastinate | Lakeshore ÷ raw SQL |",
        "|---|---|" + "---:|" * (len(SYSTEMS) + 2),
    ]
    for section in sections:
        lines.append(f"| **{section.title}** |" + " |" * (len(SYSTEMS) + 3))
        for result in section.rows:
            row = result.row
            arrow = "↑" if row.higher_is_better else "↓"
            cells = [_cell(result, system) for system in SYSTEMS]
            ratios = [times(result.ratio(LAKESHORE, other)) for other in (PROCRASTINATE, RAW)]
            lines.append(f"| {row.label} | {row.unit} {arrow} | {' | '.join(cells + ratios)} |")
    return lines


def targets(sections: list[SectionResult]) -> list[str]:
    results = [result for section in sections for result in section.rows]
    lines = ["| target | measured | result |", "|---|---:|---|"]
    for target in TARGETS:
        mine = [r for r in results if _matches(r.row.key, target.row)]
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
    if target.against is None:  # an absolute bound
        if value is None:
            return "— | not measured"
        verdict = "met" if value < target.goal else "not met"
        return f"{number(value)} {result.row.unit} | {verdict}"
    theirs = result.median(PROCRASTINATE)
    if theirs is None:
        theirs = next(
            (
                r.median(PROCRASTINATE)
                for r in results
                if _matches(r.row.key, target.against) and r.median(PROCRASTINATE)
            ),
            None,
        )
    if value is None or not theirs:
        return "— | not measured"
    ratio = value / theirs
    verdict = "met" if ratio >= target.goal else "not met"
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


def render(
    sections: list[SectionResult],
    *,
    facts: list[str],
    skipped: list[str],
    extra: dict[str, list[str]],
) -> str:
    _borrow(sections)
    lines = ["# Lakeshore vs raw SQL vs procrastinate (`make bench`)", ""]
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
    return "\n".join(lines) + "\n"
