"""The README's "What happened" examples, read from README.md: each `$ lakeshore …` line
is run with the real command against a live server holding the hour the README
describes, and what it prints must be the lines printed below it (the time the window
starts aside)."""

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from jobs.models import Invocation
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, reset_sequences=True)]

ROOT = Path(__file__).resolve().parents[2]
MOMENT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
DISK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/train.py", line 88, in save\n'
    "    f.write(state)\n"
    "OSError: [Errno 28] No space left on device: '/scratch/ckpt'\n"
)


def examples() -> list[tuple[str, str]]:
    """(command, output) of each console block under '## What happened'."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## What happened\n", 1)[1].split("\n## ", 1)[0]
    found = []
    for block in section.split("```console\n")[1:]:
        body = block.split("```", 1)[0]
        command, _, output = body.partition("\n")
        found.append((command.removeprefix("$ "), output))
    return found


def ended(state, *, ago_s, waited_ms=0, ran_ms=0, error=""):
    finished = timezone.now() - timedelta(seconds=ago_s)
    started = finished - timedelta(milliseconds=ran_ms)
    row = Invocation.objects.create(queue="train", function="train.step", state=state, error=error)
    Invocation.objects.filter(pk=row.pk).update(
        created_at=started - timedelta(milliseconds=waited_ms),
        started_at=None if state == "killed" else started,
        finished_at=finished,
        attempts=0 if state == "killed" else 1,
    )


def the_readmes_hour():
    """120 steps of about half a minute; nine failures of two kinds; one time-out; one
    job killed while it waited."""
    builders.queue(name="train")
    for i in range(120):
        ended("succeeded", ago_s=3000 - 20 * i, waited_ms=200 + 40 * i, ran_ms=30_000 + 100 * i)
    for i in range(6):
        ended("failed", ago_s=600 - 60 * i, waited_ms=500, ran_ms=12_000, error=DISK)
    for i in range(3):
        ended("failed", ago_s=900 - 60 * i, waited_ms=300, ran_ms=800, error="KeyError: 'label'")
    stopped = "stopped after timeout_s=600 s"
    ended("timeout", ago_s=120, waited_ms=250, ran_ms=600_400, error=stopped)
    ended("killed", ago_s=60)


def test_the_section_has_examples():
    commands = [command for command, _ in examples()]
    assert "lakeshore queues stats train" in commands
    assert "lakeshore stats" in commands


@pytest.mark.parametrize("command, output", examples(), ids=[c for c, _ in examples()])
def test_each_example_prints_what_the_readme_shows(sh, command, output):
    the_readmes_hour()
    printed = sh(command).stdout
    assert MOMENT.sub("…", printed) == MOMENT.sub("…", output)
