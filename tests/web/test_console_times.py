"""The console's one relative time (jobs/templatetags/console_tags.py `ago`)."""

from datetime import UTC, datetime, timedelta

from jobs.templatetags.console_tags import ago, ago_text

NOW = datetime(2026, 12, 4, 12, 5, 30, tzinfo=UTC)


def test_seconds_below_a_minute_then_minutes_hours_and_days():
    cases = {
        0: "0 seconds ago",
        1: "1 second ago",
        12: "12 seconds ago",
        59: "59 seconds ago",
        60: "1 minute ago",
        150: "2 minutes ago",
        3600: "1 hour ago",
        7300: "2 hours ago",
        86400 * 3 + 5: "3 days ago",
    }
    for seconds, text in cases.items():
        assert ago_text(NOW - timedelta(seconds=seconds), now=NOW) == text
    assert ago_text(NOW + timedelta(seconds=12), now=NOW) == "in 12 seconds"


def test_it_is_a_time_element_with_the_exact_time_on_hover():
    html = ago(datetime(2026, 12, 4, 12, 5, 0, tzinfo=UTC))
    assert html.startswith(
        '<time datetime="2026-12-04T12:05:00+00:00" title="2026-12-04 12:05:00 UTC">'
    )
    assert html.endswith(" ago</time>")
    assert ago(None) == "-"
