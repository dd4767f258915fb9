"""The house rules a reader relies on, checked over the source: no private API of the
frameworks (a name with a leading underscore that the project does not define itself),
and no state or kind spelled out in a template's condition (the models' predicates say
it once). Imports sit at the top of a file: ruff's PLC0415 checks it (pyproject.toml).
Files are cut by concept, one concept a module, not by a count of lines."""

import ast
import re
from pathlib import Path

from accounts.audit import DECISION
from fleet.models import DaemonState
from jobs.models import InvocationState
from queues.models import QueueKind, QueueState

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "accounts",
    "fleet",
    "jobs",
    "queues",
    "lakeshore",
    "lakeshore_admin",
    "edge",
    "scripts",
)
# Where templates live: the shared ones in templates/, each app's pages in <app>/templates/.
TEMPLATE_FOLDERS = (
    "templates",
    "accounts/templates",
    "jobs/templates",
    "queues/templates",
    "fleet/templates",
)
# Leading underscore, public all the same: Model._meta is Django's documented model
# API, Model._default_manager its documented first manager, os._exit the documented
# exit without clean-up (a forked child's).
PUBLIC_ANYWAY = {"_meta", "_default_manager", "_exit"}


def sources(packages: tuple[str, ...] = PACKAGES) -> list[Path]:
    return sorted(
        path
        for package in packages
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    )


def private_uses(trees: dict[Path, ast.Module]) -> list[str]:
    """`x._name` and `from m import _name` where the project never defines `_name`."""
    ours = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                ours.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                ours.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                ours.add(node.attr)
            elif isinstance(node, ast.arg):
                ours.add(node.arg)
    found = []
    for path, tree in trees.items():
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith(PACKAGES):
                names = [alias.name for alias in node.names]
            for name in names:
                if (
                    name.startswith("_")
                    and not name.startswith("__")
                    and name not in ours
                    and name not in PUBLIC_ANYWAY
                ):
                    found.append(f"{where}:{node.lineno}: {name}")
    return found


def test_no_private_framework_api():
    trees = {path: ast.parse(path.read_text(), str(path)) for path in sources()}
    assert private_uses(trees) == []


def test_the_check_sees_a_private_call():
    """The negative control: Django's own private cursor wrapping, as rows.py once used."""
    tree = ast.parse("from django.db import connection\nconnection._prepare_cursor(None)\n")
    assert private_uses({ROOT / "example.py": tree}) == ["example.py:2: _prepare_cursor"]
    imported = ast.parse("from django.http.request import _get_raw_host\n")
    assert private_uses({ROOT / "example.py": imported}) == ["example.py:1: _get_raw_host"]


STATE_WORDS = {
    str(value)
    for choices in (InvocationState, DaemonState, QueueState, QueueKind)
    for value in choices.values
} | {DECISION, "controller"}  # the timeline's kinds of row
CONDITION = re.compile(r"{%\s*(?:if|elif)\b([^%]*)%}")
QUOTED = re.compile(r"""["']([a-z_]+)["']""")


def raw_states(text: str) -> list[str]:
    return [
        word
        for condition in CONDITION.findall(text)
        for word in QUOTED.findall(condition)
        if word in STATE_WORDS
    ]


def test_no_template_compares_a_raw_state():
    found = {
        str(path.relative_to(ROOT)): words
        for folder in TEMPLATE_FOLDERS
        for path in sorted((ROOT / folder).rglob("*.html"))
        if (words := raw_states(path.read_text()))
    }
    assert found == {}


def test_the_template_check_sees_a_raw_state():
    """The negative control: the comparison queue_detail.html once made."""
    assert raw_states('{% if queue.kind == "boltzmann" %}t{% endif %}') == ["boltzmann"]
    assert raw_states("{% if job.state in 'queued running' %}") == []  # one word only
    assert raw_states("{% elif d.state != 'lost' %}") == ["lost"]
