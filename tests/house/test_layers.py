"""The layers (pyproject.toml, [tool.importlinter]) hold, and breaking one fails.

`make test` runs `lint-imports` on the tree itself (the Makefile's lint step). These
tests show that the contracts bite: on a copy of the tree, one import added against a
contract makes `lint-imports` fail and name it, while the same copy without that import
passes (the negative control). And no import cycle appears between the project's
modules, counting imports made inside functions."""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("lakeshore", "lakeshore_admin", "edge", "accounts", "jobs", "queues", "fleet")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# No cycle is left (the fleet move broke the last one, inside queues/): keep it so.
KNOWN_CYCLES: list[set[str]] = []


def copy_tree(dest: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(  # noqa: S603 - our own tool
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def add_import(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")


@pytest.mark.parametrize(
    ("module", "line", "refusal"),
    [
        # a model reaching up into the console views of its app
        (
            "jobs/models.py",
            "from jobs import views",
            "jobs.models is not allowed to import jobs.views",
        ),
        # services reaching up into the API
        (
            "queues/services.py",
            "from queues.api import views",
            "queues.services is not allowed to import queues.api",
        ),
        # a lower app calling a rule of a higher one
        (
            "jobs/transitions/claim.py",
            "from queues import services",
            "jobs is not allowed to import queues",
        ),
        # the CLI and daemon pulling in Django
        ("lakeshore/client.py", "import django", "lakeshore is not allowed to import django"),
        # the wiring reaching into a domain app
        (
            "lakeshore_admin/pagination.py",
            "from jobs import transitions",
            "lakeshore_admin is not allowed to import jobs",
        ),
        # the wiring reaching into the serving door, outside the entry points
        (
            "lakeshore_admin/pagination.py",
            "from edge import threads",
            "lakeshore_admin is not allowed to import edge",
        ),
        # an app reaching up into the serving door
        (
            "fleet/protocol.py",
            "from edge import lean_path",
            "fleet is not allowed to import edge",
        ),
    ],
)
def test_an_import_against_a_contract_fails_lint_imports(tmp_path, module, line, refusal):
    tree = copy_tree(tmp_path)
    control = lint_imports(tree)
    assert control.returncode == 0, control.stdout + control.stderr  # the copy passes as is
    add_import(tree / module, line)
    broken = lint_imports(tree)
    assert broken.returncode != 0
    assert refusal in " ".join(broken.stdout.split()), broken.stdout


def test_the_wiring_names_the_apps_in_its_entry_points_only():
    """lakeshore_admin imports a domain module (or the edge) only where it mounts them:
    the URLs and the two entry points. A new exemption fails here."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    wiring = next(c for c in contracts["contracts"] if c["source_modules"] == ["lakeshore_admin"])
    assert sorted(wiring["ignore_imports"]) == [
        "lakeshore_admin.asgi -> **",
        "lakeshore_admin.urls -> **",
        "lakeshore_admin.wsgi -> **",
    ]


def strongly_connected(graph, modules: set[str]) -> list[set[str]]:
    """Tarjan's components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(start: str) -> None:  # iterative: no recursion limit
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next((c for c in children if c in modules), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return found


def project_graph():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)  # every import, those in functions too
    modules = {m for m in graph.modules if ".migrations" not in m}
    return graph, modules


def test_no_import_cycle():
    graph, modules = project_graph()
    assert sorted(map(sorted, strongly_connected(graph, modules))) == sorted(
        map(sorted, KNOWN_CYCLES)
    )


def test_the_cycle_finder_finds_a_cycle():
    """Negative control: an import back from a module its importer reaches is found."""
    graph, modules = project_graph()
    graph.add_import(importer="lakeshore_admin.pagination", imported="jobs.transitions")
    graph.add_import(importer="jobs.transitions", imported="lakeshore_admin.pagination")
    cycles = strongly_connected(graph, modules)
    assert {"lakeshore_admin.pagination", "jobs.transitions"} in cycles
