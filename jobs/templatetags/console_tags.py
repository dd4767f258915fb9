"""Template filters of the console: `{% load console_tags %}`."""

import re

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.html import conditional_escape, format_html, format_html_join

register = template.Library()


@register.filter
def duration(seconds) -> str:
    """Seconds as people read them: 850 ms, 4.2 s, 3 min 20 s, 2 h 5 min, 3 d 4 h."""
    if seconds is None or seconds == "":
        return "-"
    seconds = float(seconds)
    if seconds < 0:
        seconds = 0.0
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


@register.filter
def milliseconds(ms) -> str:
    """Milliseconds as `duration` shows seconds; None: '-'."""
    return "-" if ms is None or ms == "" else duration(float(ms) / 1000)


@register.filter
def first_line(text) -> str:
    """The last non-empty line of an error (a traceback's last line says what failed),
    or the first line of a message."""
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]


UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def ago_text(at, now=None) -> str:
    """How long ago `at` was, as people say it: "12 seconds ago" below a minute, then
    minutes, hours and days ("3 minutes ago", "2 hours ago", "4 days ago"); a time
    ahead reads "in 12 seconds"."""
    seconds = ((now or timezone.now()) - at).total_seconds()
    ahead = seconds < 0
    seconds = abs(int(seconds))
    unit, size = next(((u, n) for u, n in UNITS if seconds >= n), UNITS[-1])
    count = seconds // size
    words = f"{count} {unit}{'' if count == 1 else 's'}"
    return f"in {words}" if ahead else f"{words} ago"


@register.filter
def ago(at) -> str:
    """The one way the console shows a relative time: <time> with the moment in
    `datetime` and the exact time (UTC) on hover, reading "12 seconds ago". Pages that
    show it refresh, which keeps it current. No time: "-"."""
    if not at:
        return "-"
    exact = timezone.localtime(at).strftime("%Y-%m-%d %H:%M:%S %Z")
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', at.isoformat(), exact, ago_text(at)
    )


TARGET = re.compile(r"^(job|daemon|queue) (\S+)$")


def target_url(target: str) -> str | None:
    """The console page of an event's target ("job 4", "daemon 7", "queue train"), or
    None for targets without one (tokens, providers)."""
    found = TARGET.match(target or "")
    if not found:
        return None
    kind, ref = found.groups()
    if kind == "job" and ref.isdigit():
        return reverse("jobs:detail", args=[int(ref)])
    if kind == "daemon" and ref.isdigit():
        return f"{reverse('fleet:daemons')}?id={ref}"
    if kind == "queue":
        return reverse("queues:detail", args=[ref])
    return None


@register.filter
def event_what(event: dict) -> str:
    """An operator action's "what": its target linked to its page ("job 4", "daemon 7")
    and its summary, where the daemon's name (`daemon_name`, when the list looked it up)
    links to the daemon's page too."""
    target, summary = event.get("target") or "", event.get("summary") or ""
    url = target_url(target)
    name = event.get("daemon_name")
    if url and name and name in summary:
        before, _, after = summary.partition(name)
        summary = format_html('{}<a href="{}">{}</a>{}', before, url, name, after)
    if not target:
        return conditional_escape(summary)
    if url:
        return format_html('<strong><a href="{}">{}</a></strong>: {}', url, target, summary)
    return format_html("<strong>{}</strong>: {}", target, summary)


REFERENCE = re.compile(r"\b(job|daemon) (\d+)\b")


@register.filter
def link_refs(text) -> str:
    """Plain text with each "job 4" and "daemon 7" in it linked to that page (a job's
    timeline: "started on daemon 7", "retried as job 12"); the rest escaped."""
    text = str(text or "")
    pieces, start = [], 0
    for found in REFERENCE.finditer(text):
        pieces.append(conditional_escape(text[start : found.start()]))
        pieces.append(
            format_html('<a href="{}">{}</a>', target_url(found.group(0)), found.group(0))
        )
        start = found.end()
    pieces.append(conditional_escape(text[start:]))
    return format_html_join("", "{}", ((piece,) for piece in pieces))
