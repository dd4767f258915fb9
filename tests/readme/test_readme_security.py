"""The README's "Security" table tells the truth: each bound it names by a setting has
that setting's default, as the server reads it in a clean environment (no LAKESHORE_*
variable set), and each setting it names is one the server has. A row whose setting
is "—" is a rule with no knob (its attack has a test of its own, marked `security`)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION = re.compile(r"^## Security\n(.*?)^## ", re.S | re.M)
SETTING = re.compile(r"`([A-Z][A-Z0-9_]+)`")  # the first one a row's setting cell names
UNITS = {"s": 1, "KiB": 1024, "MiB": 1024 * 1024}
DEFAULT = re.compile(r"^([\d,]+)(?: (s|KiB|MiB))?$")


def table() -> list[dict[str, str]]:
    """The Security table's rows, by column heading."""
    section = SECTION.search((ROOT / "README.md").read_text())
    assert section, 'README.md has no "## Security" section'
    lines = [line for line in section.group(1).splitlines() if line.startswith("|")]
    heading, _, *rows = (
        [cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines
    )
    return [dict(zip(heading, row, strict=True)) for row in rows]


ROWS = table()
NAMED = {
    match.group(1): row["default"] for row in ROWS if (match := SETTING.search(row["setting"]))
}


def server_defaults(names) -> dict:
    """The settings' values as the server reads them with none of its variables set."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LAKESHORE_", "DJANGO_", "DATABASE_URL"))
    }
    env["DATABASE_URL"] = "postgresql://nobody@127.0.0.1:1/none"  # parsed, never reached
    env["DJANGO_SETTINGS_MODULE"] = "lakeshore_admin.settings"
    script = (
        "import json, sys; from django.conf import settings; "
        "print(json.dumps({n: getattr(settings, n, None) for n in sys.argv[1:]}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, *names],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout)


def as_value(shown: str):
    """A default as the table shows it: '20 s', '10 MiB', '1,000', or a path list."""
    if match := DEFAULT.match(shown):
        number, unit = match.groups()
        return int(number.replace(",", "")) * UNITS.get(unit, 1)
    return shown.split(",")


def test_the_table_names_the_bounds_of_every_kind_of_caller():
    callers = {row["caller"].split(" (")[0] for row in ROWS}
    assert {"a stranger", "any token", "an operator", "a daemon token", "a job"} <= callers
    assert len(NAMED) >= 25  # the parse sees the settings (a control of the regexes)


def test_each_default_is_the_servers():
    actual = server_defaults(sorted(NAMED))
    unknown = [name for name, value in actual.items() if value is None]
    assert not unknown, f"the README's Security table names settings the server lacks: {unknown}"
    wrong = {
        name: (shown, actual[name])
        for name, shown in NAMED.items()
        if as_value(shown) != actual[name]
    }
    assert not wrong, f"README default vs the server's: {wrong}"


@pytest.mark.parametrize(
    ("shown", "value"),
    [("20 s", 20), ("10 MiB", 10 * 1024 * 1024), ("8,190", 8190), ("/etc/slurm", ["/etc/slurm"])],
)
def test_the_control_defaults_are_read_as_the_server_holds_them(shown, value):
    assert as_value(shown) == value
