from lakeshore.commands.queues import elasticity_text
from lakeshore.output import format_table, when


def test_it_aligns_columns_three_spaces_apart_under_upper_case_headers():
    text = format_table(
        ["name", "kind", "description"], [["a", "priority", "x y"], ["bbbb", "fifo", ""]]
    )
    assert text.splitlines() == [
        "NAME   KIND       DESCRIPTION",
        "a      priority   x y",
        "bbbb   fifo       -",
    ]


def test_it_leaves_no_trailing_spaces():
    text = format_table(["A", "B"], [["long value", ""]])
    assert all(line == line.rstrip() for line in text.splitlines())


def test_it_shows_each_elasticity_compactly():
    assert elasticity_text(None) == "-"
    assert elasticity_text({"kind": "fixed", "min": 3, "max": None, "threshold": None}) == "fixed 3"
    pool = {"kind": "pool_with_threshold", "min": 2, "max": 16, "threshold": 0.7}
    assert elasticity_text(pool) == "pool-with-threshold 2..16 @0.7"
    elastic = {"kind": "fully_elastic", "min": None, "max": None, "threshold": None}
    assert elasticity_text(elastic) == "fully-elastic 0..unbounded"
    assert elasticity_text({"kind": "max_count", "max": 8}) == "max-count 0..8"


def test_it_prints_times_in_utc_to_the_second():
    assert when("2026-01-02T03:04:05.123456Z") == "2026-01-02T03:04:05Z"
    assert when("2026-01-02T04:04:05+01:00") == "2026-01-02T03:04:05Z"
    assert when(None) == "-"


def test_a_table_cell_shows_control_characters_as_cat_v_does():
    text = format_table(["reason"], [["a\x1b[2J\r\x07\x7f\x9b\tb\nc"]])

    assert text.splitlines()[1] == "a^[[2J^M^G^?M-^[\tb c"
