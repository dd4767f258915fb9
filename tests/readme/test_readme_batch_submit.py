"""The README's "Many jobs at once" example is what the CLI prints: the file its `cat`
shows is written, each `$ lakeshore …` line is run, in order, against a live server
with a daemon serving gpu, and its output (stdout, then stderr) compared line by line,
the seconds of a summary aside. The error it quotes inline is checked the same way."""

import re
from pathlib import Path

import pytest

from jobs.models import Invocation
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

README = Path(__file__).resolve().parents[2] / "README.md"
SECONDS = re.compile(r" in \d+\.\d s$")


def section() -> str:
    text = README.read_text()
    start = text.index("**Many jobs at once.**")
    return text[start : text.index("\n## ", start)]


def runs() -> list[tuple[str, list[str]]]:
    """The console block's commands, each with the lines it prints."""
    body = re.search(r"```console\n(.*?)```", section(), re.S)
    assert body, "the section has no console block"
    found: list[tuple[str, list[str]]] = []
    for line in body.group(1).splitlines():
        if line.startswith("$ "):
            found.append((line[2:], []))
        elif line:
            found[-1][1].append(line)
    return found


def test_the_readmes_batch_example_prints_what_it_shows(sh, tmp_path):
    builders.queue(name="gpu")
    builders.daemon(queues=["gpu"])
    (cat, lines), *commands = runs()
    assert cat == "cat jobs.jsonl"
    (tmp_path / "jobs.jsonl").write_text("".join(f"{line}\n" for line in lines))
    assert len(commands) == 3
    for command, expected in commands:
        failed = any(line.startswith("error: ") for line in expected)
        result = sh(f"cd {tmp_path} && {command}", exit=1 if failed else 0)
        printed = (result.stdout + result.stderr).splitlines()
        assert [SECONDS.sub(" in N s", line) for line in printed] == [
            SECONDS.sub(" in N s", line) for line in expected
        ], command
    jobs = Invocation.objects.filter(queue="gpu").order_by("id")
    assert list(jobs.values_list("args", "kwargs", "key", "priority")) == [
        ([1], {}, "day-1", 0),
        ([2], {}, "day-2", 5),
        ([], {"text": "three"}, "day-3", 0),
    ]
    assert not Invocation.objects.filter(queue="").exists()


def test_the_error_quoted_for_a_bad_line_is_what_the_cli_prints(sh, tmp_path):
    quoted = re.search(r"`(error: jobs\.jsonl:17: [^`]*)`", " ".join(section().split()))
    assert quoted, "the section quotes no error at line 17"
    lines = ['{"args": [1]}'] * 16 + ['{"kwargs": [1]}']
    (tmp_path / "jobs.jsonl").write_text("\n".join(lines) + "\n")

    result = sh(f"cd {tmp_path} && lakeshore jobs submit x.y --batch jobs.jsonl", exit=1)

    assert result.stderr.splitlines()[0] == quoted.group(1)
