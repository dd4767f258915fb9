"""The README's settings tables tell the truth: every `LAKESHORE_*` variable the code
reads has a row ("Settings (environment)" for the product, "Tests" for what only the
tests and benches read), and every row names a variable something reads.

"Reads" is found in the source's syntax: a name passed to `os.environ.get`,
`os.getenv`, `env_str`/`env_bool`/`env_number`/`env_list`, looked up as
`os.environ[NAME]`, tested with `in os.environ`, or listed in a module's `*_ENVS`
tuple. A name only ever written (a dict key of a child's environment, an assignment,
a `setdefault` or a `pop`) is set for someone else and needs no row of its own."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("accounts", "fleet", "jobs", "queues", "lakeshore", "lakeshore_admin", "scripts")
HARNESS = ("tests", "bench")
# settings_test.py is the tests' settings module: what it reads is the tests' business.
HARNESS_FILES = ("lakeshore_admin/settings_test.py",)
# Set by the daemon for each job it runs (README "Guarantees" lists them), read by jobs.
SET_FOR_JOBS = {"LAKESHORE_INVOCATION_ID", "LAKESHORE_ATTEMPT"}
READERS = {"get", "getenv", "env_str", "env_bool", "env_number", "env_list"}
NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _files(packages) -> list[Path]:
    found = []
    for package in packages:
        found += [p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts]
    scripts = ROOT / "scripts"
    if "scripts" in packages:
        found += [p for p in scripts.iterdir() if p.is_file() and p.suffix == ""]
    return found


def product_files() -> list[Path]:
    return [p for p in _files(PRODUCT) if str(p.relative_to(ROOT)) not in HARNESS_FILES]


def _is_python(path: Path) -> bool:
    shebang = path.read_text(errors="replace").startswith("#!/usr/bin/env python")
    return path.suffix == ".py" or shebang


def module_constants(tree: ast.Module) -> dict[str, object]:
    """`NAME = "LAKESHORE_X"` at module level, read elsewhere as `os.environ.get(NAME)`."""
    return {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def names_read(source: str, constants: dict | None = None) -> set[str]:
    """The environment variables this Python source reads (see the module's docstring)."""
    tree = ast.parse(source)
    constants = {**(constants or {}), **module_constants(tree)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if isinstance(first, ast.Name) and first.id in constants:
                first = ast.Constant(constants[first.id])
            of_environ = called != "get" or _is_environ(getattr(func, "value", None))
            if called in READERS and isinstance(first, ast.Constant) and of_environ:
                found.add(first.value)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if _is_environ(node.value) and isinstance(node.slice, ast.Constant):
                found.add(node.slice.value)
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
            if any(_is_environ(c) for c in node.comparators):
                found.add(node.left.value)
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List)):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if any(t.endswith("_ENVS") for t in targets):
                found |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return {name for name in found if isinstance(name, str) and NAME.match(name)}


def _is_environ(node) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id == "environ"


def read_by(paths) -> set[str]:
    sources = [path.read_text() for path in paths if _is_python(path)]
    constants = {}  # a constant imported from another module (JOB_ENV_EXTRA)
    for source in sources:
        constants |= module_constants(ast.parse(source))
    found = set()
    for source in sources:
        found |= names_read(source, constants)
    return found


def read_by_shell() -> set[str]:
    """Makefile and .ci/run: `$(NAME)`/`${NAME}`/`$NAME` of a LAKESHORE_ variable."""
    text = (ROOT / "Makefile").read_text() + (ROOT / ".ci" / "run").read_text()
    return set(re.findall(r"\$[({]?(LAKESHORE_[A-Z0-9_]+)", text))


def table_rows(section: str) -> set[str]:
    readme = (ROOT / "README.md").read_text()
    match = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## )", readme, re.M | re.S)
    assert match, f"README has no section '## {section}'"
    rows = set()
    for line in match.group(1).splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            rows |= set(re.findall(r"`([A-Z][A-Z0-9_]*)`", first_cell))
    return rows


def test_every_variable_the_product_reads_has_a_settings_row():
    product = {n for n in read_by(product_files()) if n.startswith("LAKESHORE_")}
    missing = sorted(product - table_rows("Settings (environment)"))
    assert not missing, f"read by the code, no row in README's Settings table: {missing}"


def test_every_variable_only_the_tests_read_has_a_row_in_tests():
    harness_files = [*_files(HARNESS), *(ROOT / f for f in HARNESS_FILES)]
    harness = {n for n in read_by(harness_files) | read_by_shell() if n.startswith("LAKESHORE_")}
    documented = table_rows("Settings (environment)") | table_rows("Tests")
    missing = sorted(harness - documented - SET_FOR_JOBS)
    assert not missing, f"read by the tests or benches, no row in README: {missing}"


def test_every_row_names_a_variable_that_is_read():
    everything = read_by([*_files(PRODUCT), *_files(HARNESS)]) | read_by_shell()
    everything |= {"LAKESHORE_URL"}  # also read by the SDK (see "From Python")
    for section in ("Settings (environment)", "Tests"):
        stale = sorted(table_rows(section) - everything)
        assert not stale, f"README's {section} table names variables nothing reads: {stale}"


def test_the_variables_set_for_jobs_are_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in SET_FOR_JOBS)


def test_the_reader_finds_reads_and_skips_writes():
    """Negative control: the finder tells a read from a variable set for a child."""
    source = """
import os
a = os.environ.get("LAKESHORE_A", "1")
b = env_number("LAKESHORE_B", 3, minimum=1)
c = os.environ["LAKESHORE_C"]
d = "LAKESHORE_D" in os.environ
TOKEN_ENVS = ("LAKESHORE_E",)
child = {"LAKESHORE_SET": "x"}
os.environ["LAKESHORE_STORED"] = "y"
os.environ.setdefault("LAKESHORE_DEFAULTED", "z")
os.environ.pop("LAKESHORE_POPPED", None)
other = {}.get("LAKESHORE_NOT_ENV")
EXTRA = "LAKESHORE_F"
f = os.environ.get(EXTRA, "")
"""
    assert names_read(source) == {f"LAKESHORE_{x}" for x in "ABCDEF"}
