"""Template filters of the console: `{% load console_tags %}`."""

from django import template

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
def first_line(text) -> str:
    """The last non-empty line of an error (a traceback's last line says what failed),
    or the first line of a message."""
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]
