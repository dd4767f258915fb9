"""The README's `lakeshore apply` outputs ("Operate as code") are what the CLI prints: each
`$ lakeshore …` line of its console blocks is run, in order, against a live server set
up as the README's story has it, and its output (stdout, then stderr) compared line by
line. The outputs it quotes inline are checked the same way."""

import re
import textwrap
from pathlib import Path

import pytest

from tests.support import builders
from tests.support.shell import write

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

README = Path(__file__).resolve().parents[2] / "README.md"
POOL = {"kind": "pool_with_threshold", "min": 1, "max": 4, "threshold": 0.5}

# what lakeshore.yaml holds for each console block of the section
DECLARED = """\
providers:
  - name: here
    kind: simulated
queues:
  - name: train
    description: b
    provider: here
    elasticity: {kind: pool_with_threshold, min: 1, max: 8, threshold: 0.5}
  - name: eval
    kind: priority
"""
HYPHENATED = """\
queues:
  - name: ok
  - name: train
    elasticity:
      kind: pool-with-threshold
      threshold: 0.5
"""


def section() -> str:
    text = README.read_text()
    start = text.index("## Operate as code: `lakeshore.yaml`")
    return text[start : text.index("\n## ", start + 1)]


def console_blocks() -> list[list[tuple[str, list[str]]]]:
    """Each ```console block as [(command, its output lines)]."""
    blocks = []
    for body in re.findall(r"```console\n(.*?)```", section(), re.S):
        runs: list[tuple[str, list[str]]] = []
        for line in body.splitlines():
            if line.startswith("$ "):
                runs.append((line[2:], []))
            elif line:
                runs[-1][1].append(line)
        blocks.append(runs)
    return blocks


def before_the_first(workdir):
    builders.provider(name="here")
    builders.queue(name="train", description="a", provider="here", elasticity_spec=POOL)
    builders.queue(name="old")
    write(workdir, DECLARED)


def before_the_refusal(workdir):
    builders.queue(name="scratch")
    builders.daemon(queues=["scratch"], name="gpu-box", pk=3)


def before_the_error(workdir):
    write(workdir, textwrap.dedent(HYPHENATED))


def test_the_readmes_apply_outputs_are_what_the_cli_prints(sh, tmp_path):
    blocks = console_blocks()
    setups = [before_the_first, before_the_refusal, before_the_error]
    assert len(blocks) == len(setups), "a console block was added: give it its setup here"
    for setup, runs in zip(setups, blocks, strict=True):
        setup(tmp_path)
        for command, expected in runs:
            failed = any(line.startswith("error: ") for line in expected)
            result = sh(f"cd {tmp_path} && {command}", exit=1 if failed else 0)
            assert (result.stdout + result.stderr).splitlines() == expected, command


def test_the_summary_quoted_for_a_refused_apply_is_what_the_cli_prints(sh, tmp_path):
    before_the_first(tmp_path)
    sh(f"cd {tmp_path} && lakeshore apply -f lakeshore.yaml --prune")
    before_the_refusal(tmp_path)

    result = sh(f"cd {tmp_path} && lakeshore apply -f lakeshore.yaml --prune", exit=1)

    summary = result.stdout.splitlines()[-1]
    assert summary.startswith("Refused: ")
    assert f"`{summary}`" in " ".join(section().split())


def test_the_kind_change_quoted_is_what_the_cli_prints(sh, tmp_path):
    sh("lakeshore queues add train")
    write(tmp_path, "queues:\n  - name: train\n    kind: priority\n")

    result = sh(f"cd {tmp_path} && lakeshore apply -f lakeshore.yaml", exit=1)

    first = result.stderr.splitlines()[0]
    assert first.startswith("error: lakeshore.yaml:3: queues[0].kind: cannot change")
    assert f"`{first}`" in " ".join(section().split())
