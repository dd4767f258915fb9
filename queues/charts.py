"""Charts of the queues' samples (queues/samples.py), drawn on the server as inline SVG:
this module turns a series into polyline points, axis ticks and a sentence saying what
the chart shows; the templates write the markup (classes only: the CSP forbids inline
styles, and static/css/charts.css colours the lines for light and dark mode)."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from jobs import insight
from jobs.templatetags.console_tags import duration
from queues import samples
from queues.models import Queue
from queues.services import PENDING_CAP

# The queue page's chart, in viewBox units (the SVG scales to its box).
WIDTH = 640
LEFT, RIGHT, TOP, BOTTOM = 56, 24, 12, 30
# The queue list's sparkline.
SPARK_WIDTH, SPARK_HEIGHT, SPARK_PAD = 120, 32, 3
SPARK_LEFT = 22  # room for the scale's top, written left of the plot

RANGE_TEXT = {"hour": "hour", "day": "day"}
# (step between x ticks, how a tick's age reads)
X_TICKS = {
    "hour": (timedelta(minutes=15), lambda d: f"−{int(d.total_seconds() // 60)} min"),
    "day": (timedelta(hours=6), lambda d: f"−{int(d.total_seconds() // 3600)} h"),
}
# The chart's two panels, each with its own y axis (a backlog of thousands must not
# flatten a pool of three daemons): (title, height, [(field, name in words, css class)]).
PANELS = [
    ("Work", 200, [("pending", "pending", "pending"), ("running", "running", "running")]),
    (
        "Daemons",
        200,
        [("daemons", "daemons", "daemons"), ("desired", "desired daemons", "desired")],
    ),
]
EMPTY_TEXT = "No samples yet: the controller samples every tick"


@dataclass(frozen=True)
class Line:
    key: str  # the css class suffix: line-pending, key-pending
    name: str
    segments: list[str]  # polyline `points`, one per run of samples without a gap
    first: int
    last: int
    peak: int
    unit: str = "count"  # or "ms": how its values read (UNITS)
    points: int = 1  # how many values it has (none: "nothing yet")

    @property
    def text(self) -> str:
        shown = UNITS[self.unit]
        if not self.points:
            return f"{self.name}: none"
        text = f"{self.name} {shown(self.first)} → {shown(self.last)}"
        if self.peak > max(self.first, self.last):
            text += f" (peak {shown(self.peak)})"
        return text


@dataclass(frozen=True)
class Tick:
    at: str  # x or y, in viewBox units, written out (no locale's decimal comma)
    label: str


@dataclass(frozen=True)
class Panel:
    """One SVG: its lines on their own y axis, with a sentence saying what it shows."""

    title: str
    label: str
    lines: list[Line]
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    height: int
    width: int = WIDTH
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP

    @property
    def bottom(self) -> int:
        return self.height - BOTTOM


@dataclass(frozen=True)
class Chart:
    range: str  # hour | day
    span_text: str  # "hour"
    panels: list[Panel] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.panels

    @property
    def lines(self) -> list[Line]:
        return [line for panel in self.panels for line in panel.lines]

    @property
    def label(self) -> str:
        if self.empty:
            return EMPTY_TEXT
        return " ".join(panel.label for panel in self.panels)


@dataclass(frozen=True)
class Mark:
    """One sample of a sparkline as a hover target: a column of the SVG's full height
    around the sample, with its value in words ("12:05 — 3 pending")."""

    x: str
    width: str
    text: str


@dataclass(frozen=True)
class Sparkline:
    """Pending over the last hour on a scale: a baseline at 0 and a top line at `top`
    (its label) across the whole hour, so a quiet queue reads as a flat line at 0 on a
    scale, not as a stray mark where the samples began."""

    segments: list[str]
    label: str
    top: int
    marks: list[Mark] = field(default_factory=list)
    width: int = SPARK_WIDTH
    height: int = SPARK_HEIGHT
    left: int = SPARK_LEFT
    right: int = SPARK_WIDTH - SPARK_PAD
    top_y: int = SPARK_PAD
    base_y: int = SPARK_HEIGHT - SPARK_PAD


def _count(value: int) -> str:
    """A count as the queue page shows it: above the cap, "10000+"."""

    return f"{PENDING_CAP}+" if value > PENDING_CAP else str(value)


def _milliseconds(ms: float) -> str:
    return duration(ms / 1000)


UNITS = {"count": _count, "ms": _milliseconds}


def nice_ceiling(value: float) -> int:
    """The smallest 1, 2 or 5 × 10^k at or above value (at least 1): the y axis' top."""
    top = 1
    while True:
        for step in (1, 2, 5):
            if step * top >= value:
                return step * top
        top *= 10


def _gap(bucket: timedelta) -> timedelta:
    """How far apart two points may be and still be joined: two buckets, or two ticks
    when the controller ticks less often than once a bucket."""
    return max(2 * bucket, timedelta(seconds=2 * settings.LAKESHORE_TICK_SECONDS))


def _segments(points: list[tuple[datetime, float]], x, y, bucket: timedelta) -> list[str]:
    """Polyline `points` strings, a new one wherever samples are missing for longer than
    `_gap` (the controller was not running): a line never bridges a hole. A lone sample
    is a zero-length line, which the round line cap draws as a dot."""
    gap = _gap(bucket)
    runs: list[list[str]] = []
    previous = None
    for at, value in points:
        if previous is None or at - previous > gap:
            runs.append([])
        runs[-1].append(f"{x(at):.1f},{y(value):.1f}")
        previous = at
    return [" ".join(run * 2 if len(run) == 1 else run) for run in runs]


def queue_chart(queue: Queue, range_name: str | None, *, now: datetime | None = None) -> Chart:
    """The queue page's chart over the last hour or day: pending and running, then
    daemons (actual and desired), each panel on its own y axis; one query."""
    range_name = samples.chart_range(range_name)
    _, bucket = samples.RANGES[range_name]
    now = now or timezone.now()
    points = samples.series(queue, range_name, now=now)
    if not points:
        return Chart(range=range_name, span_text=RANGE_TEXT[range_name])
    x, x_ticks = _x_axis(range_name, now)
    panels = [
        _panel(
            title,
            f"{title} on queue {queue.name}, last {RANGE_TEXT[range_name]}",
            [(css, name, [(p.at, getattr(p, key)) for p in points]) for key, name, css in drawn],
            x=x,
            x_ticks=x_ticks,
            bucket=bucket,
            height=height,
        )
        for title, height, drawn in PANELS
    ]
    return Chart(range=range_name, span_text=RANGE_TEXT[range_name], panels=panels)


def pending_sparklines(queues: list[Queue], *, now: datetime | None = None) -> dict:
    """{queue id: Sparkline or None (no samples)} of pending over the last hour, for the
    queues of one page: one query."""
    now = now or timezone.now()
    found = samples.recent_pending([queue.pk for queue in queues], now=now)
    end = samples.minute_of(now)
    start = end - samples.SPARKLINE_SPAN
    drawn = {}
    for queue_id, points in found.items():
        if not points:
            drawn[queue_id] = None
            continue
        values = [pending for _, pending in points]
        top = nice_ceiling(max(values))

        def x(at, start=start):
            width = SPARK_WIDTH - SPARK_PAD - SPARK_LEFT
            return SPARK_LEFT + width * (at - start) / samples.SPARKLINE_SPAN

        def y(value, top=top):
            return SPARK_PAD + (SPARK_HEIGHT - 2 * SPARK_PAD) * (1 - value / top)

        line = Line("pending", "pending", [], values[0], values[-1], max(values))
        step = (SPARK_WIDTH - SPARK_PAD - SPARK_LEFT) * (samples.PERIOD / samples.SPARKLINE_SPAN)
        drawn[queue_id] = Sparkline(
            segments=_segments(points, x, y, samples.PERIOD),
            label=f"{line.text} over the last hour (scale 0 to {_count(top)})",
            top=top,
            marks=[
                Mark(
                    x=f"{x(at) - step / 2:.1f}",
                    width=f"{step:.1f}",
                    text=f"{timezone.localtime(at):%H:%M} — {_count(pending)} pending",
                )
                for at, pending in points
            ],
        )
    return drawn


# ---------------------------------------------------------------------------- what ended

# The queue page's and the dashboard's panels of what ended (jobs/insight.py), over the
# range's window: how many ended a bucket, and how long they ran.
WINDOW_OF_RANGE = {"hour": "1h", "day": "24h"}
BUCKET_TEXT = {"1h": "per minute", "24h": "per 15 minutes"}


def ended_window(range_name: str | None) -> insight.Window:
    return insight.WINDOWS[WINDOW_OF_RANGE[samples.chart_range(range_name)]]


def _x_axis(range_name: str, now: datetime):
    """x(at) over the range ending at now's minute, and its ticks."""
    span, _ = samples.RANGES[range_name]
    end = samples.minute_of(now)
    start = end - span
    plot_width = WIDTH - LEFT - RIGHT

    def x(at: datetime) -> float:
        return LEFT + plot_width * (at - start) / span

    step, age = X_TICKS[range_name]
    ticks = [
        Tick(f"{x(end - i * step):.1f}", age(i * step) if i else "now")
        for i in range(span // step, -1, -1)
    ]
    return x, ticks


def _panel(title: str, label: str, drawn, *, x, x_ticks, bucket, unit="count", height=200) -> Panel:
    """One panel of `drawn` lines [(css key, name, [(at, value)])] on one y axis from 0
    to a round top (at least 1: a flat zero is a line at the bottom of a scale)."""
    top = nice_ceiling(max([value for _, _, series in drawn for _, value in series] or [0]))
    plot_height = height - TOP - BOTTOM

    def y(value: float) -> float:
        return TOP + plot_height * (1 - value / top)

    lines = []
    for key, name, series in drawn:
        values = [value for _, value in series] or [0]
        lines.append(
            Line(
                key=key,
                name=name,
                segments=_segments(series, x, y, bucket) if series else [],
                first=values[0],
                last=values[-1],
                peak=max(values),
                unit=unit,
                points=len(series),
            )
        )
    y_values = [0, top] if top % 2 else [0, top // 2, top]
    return Panel(
        title=title,
        label=f"{label}: " + ", ".join(line.text for line in lines) + ".",
        lines=lines,
        y_ticks=[Tick(f"{y(v):.1f}", UNITS[unit](v)) for v in y_values],
        x_ticks=x_ticks,
        height=height,
    )


def ended_panels(
    queue: str | None, range_name: str | None, *, now: datetime | None = None
) -> list[Panel]:
    """How many succeeded and failed (or timed out) a bucket, and how long what ended
    ran (p50, p95), over the range: of one queue, or of every queue (None). Two queries."""
    range_name = samples.chart_range(range_name)
    span = ended_window(range_name)
    now = now or timezone.now()
    x, x_ticks = _x_axis(range_name, now)
    where = "every queue" if queue is None else f"queue {queue or '(default)'}"
    start = samples.minute_of(now) - span.span  # the axis' left end: a bucket before it is cut
    ended = [b for b in insight.throughput(queue=queue, span=span, now=now) if b.at >= start]
    throughput = _panel(
        f"Ended {BUCKET_TEXT[span.name]}",
        f"Jobs that ended {BUCKET_TEXT[span.name]} on {where}, last {RANGE_TEXT[range_name]}",
        [
            ("succeeded", "succeeded", [(b.at, b.counts["succeeded"]) for b in ended]),
            (
                "failed",
                "failed or timed out",
                [(b.at, b.counts["failed"] + b.counts["timeout"]) for b in ended],
            ),
        ],
        x=x,
        x_ticks=x_ticks,
        bucket=span.bucket,
    )
    timed = [t for t in insight.timings(queue=queue, span=span, now=now) if t.at >= start]
    run_time = _panel(
        "Run time",
        f"How long jobs ran on {where}, last {RANGE_TEXT[range_name]}",
        [
            ("run-p50", "p50", [(t.at, t.run_p50) for t in timed]),
            ("run-p95", "p95", [(t.at, t.run_p95) for t in timed]),
        ],
        x=x,
        x_ticks=x_ticks,
        bucket=span.bucket,
        unit="ms",
    )
    return [throughput, run_time]
