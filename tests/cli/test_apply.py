"""`lakeshore apply -f lakeshore.yaml` and `lakeshore export`, run through bash with the
real installed `lakeshore` command against a live server."""

import json

import psycopg
import pytest
import yaml
from django.db import connection

from fleet import declarative
from fleet.models import Provider
from queues.models import Queue
from tests.support import builders
from tests.support.shell import write

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LAKESHORE_YAML = """\
providers:
  - name: here
    kind: simulated
    config: {startup_seconds: 1}
queues:
  - name: train
    kind: fifo
    description: a
    provider: here
    elasticity:
      kind: pool_with_threshold
      min: 1
      max: 4
      threshold: 0.5
  - name: eval
    kind: priority
"""


@pytest.fixture
def workdir(tmp_path):
    """A directory to write lakeshore.yaml into; `run` runs a command line there."""
    return tmp_path


def names() -> tuple[list[str], list[str]]:
    return (
        sorted(Provider.objects.values_list("name", flat=True)),
        sorted(Queue.objects.values_list("name", flat=True)),
    )


def refused(sh, workdir, line: str):
    """The command failed: exit 1, nothing on stdout, the error on stderr."""
    result = sh(f"cd {workdir} && {line}", exit=1)
    assert result.stdout == ""
    return result.stderr


def test_it_plans_applies_and_is_then_up_to_date(sh, workdir):
    write(workdir, LAKESHORE_YAML)

    plan = sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml --dry-run")
    assert plan.stdout.splitlines() == [
        "provider/here: create",
        "queue/train: create",
        "queue/eval: create",
        "Plan: 3 to create, 0 to update, 0 to delete, 0 unchanged (dry run: nothing changed)",
    ]
    assert names() == ([], [])

    applied = sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml")
    assert (
        applied.stdout.splitlines()[-1] == "Applied: 3 created, 0 updated, 0 deleted, 0 unchanged."
    )
    queue = sh.json("lakeshore queues show train --json")
    assert (queue["provider"], queue["elasticity"]["max"], queue["kind"]) == ("here", 4, "fifo")

    again = sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml")
    assert again.stdout.splitlines() == [
        "provider/here: unchanged",
        "queue/train: unchanged",
        "queue/eval: unchanged",
        "Up to date: nothing to change.",
    ]


def test_it_shows_each_update_with_its_old_and_new_value(sh, workdir):
    write(workdir, LAKESHORE_YAML)
    sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml")
    changed = LAKESHORE_YAML.replace("description: a", "description: b").replace("max: 4", "max: 8")
    write(workdir, changed)

    plan = sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml --dry-run")
    assert plan.stdout.splitlines() == [
        "provider/here: unchanged",
        'queue/train: update (description: "a" → "b", elasticity.max: 4 → 8)',
        "queue/eval: unchanged",
        "Plan: 0 to create, 1 to update, 0 to delete, 2 unchanged (dry run: nothing changed)",
    ]
    assert sh.json("lakeshore queues show train --json")["description"] == "a"

    sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml")
    queue = sh.json("lakeshore queues show train --json")
    assert (queue["description"], queue["elasticity"]["max"]) == ("b", 8)


def test_prune_deletes_what_the_file_does_not_declare(sh, workdir):
    write(workdir, LAKESHORE_YAML)
    sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml")
    sh("lakeshore queues add old && lakeshore providers add spare --kind simulated")

    plan = sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml --prune --dry-run")
    assert plan.stdout.splitlines()[-3:] == [
        "queue/old: delete",
        "provider/spare: delete",
        "Plan: 0 to create, 0 to update, 2 to delete, 3 unchanged (dry run: nothing changed)",
    ]
    assert sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml").stdout.endswith(
        "Up to date: nothing to change.\n"
    )  # without --prune, what the file leaves out stays
    sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml --prune")
    assert names() == (["here"], ["eval", "train"])


@pytest.mark.parametrize("dry_run", [" --dry-run", ""])
def test_a_prune_refused_prints_the_whole_plan_with_the_refusal(sh, workdir, dry_run):
    builders.queue(name="busy")
    first = builders.daemon(queues=["busy"], name="d-one")
    second = builders.daemon(queues=["busy"], name="d-two")
    write(workdir, LAKESHORE_YAML)

    result = sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml --prune{dry_run}", exit=1)

    refused = (
        "queue/busy: delete — refused: Queue 'busy' still has 2 bound daemon(s): "
        f"d-one ({first.pk}), d-two ({second.pk}). Remove them or use --force to unbind "
        "them. (queue_in_use)"
    )
    summary = (
        "Plan: 3 to create, 0 to update, 1 to delete (1 refused), 0 unchanged "
        "(dry run: nothing changed)"
        if dry_run
        else "Refused: 3 to create, 0 to update, 1 to delete (1 refused), 0 unchanged; "
        "nothing was changed."
    )
    assert result.stdout.splitlines() == [
        "provider/here: create",
        "queue/train: create",
        "queue/eval: create",
        refused,
        summary,
    ]
    assert result.stderr == (
        "error: 1 removal of the plan is refused (queue busy), so nothing was changed "
        "(lakeshore apply --prune never forces: drain the queue first, or remove it by hand "
        "with 'lakeshore queues rm NAME --force').\n"
    )
    assert names() == ([], ["busy"])


def test_a_refused_plan_with_json_prints_the_apis_answer(sh, workdir):
    builders.queue(name="busy")
    builders.daemon(queues=["busy"])
    write(workdir, LAKESHORE_YAML)

    result = sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml --prune --json", exit=1)

    error = json.loads(result.stdout)["error"]
    assert error["code"] == "apply_refused"
    assert [i["refused"] and i["refused"]["code"] for i in error["items"]] == [
        None,
        None,
        None,
        "queue_in_use",
    ]


def test_a_hyphenated_elasticity_kind_is_shown_at_its_line(sh, workdir):
    write(
        workdir,
        """\
        queues:
          - name: ok
          - name: train
            elasticity:
              kind: pool-with-threshold
              threshold: 0.5
        """,
    )

    stderr = refused(sh, workdir, "lakeshore apply -f lakeshore.yaml")

    assert stderr.splitlines()[0] == (
        "error: lakeshore.yaml:5: queues[1].elasticity.kind: 'pool-with-threshold' is the "
        "CLI flag's spelling; the API and lakeshore.yaml take 'pool_with_threshold'."
    )
    assert names() == ([], [])  # not even the good queue


def test_the_servers_refusals_are_shown_at_their_lines(sh, workdir):
    sh("lakeshore queues add train")
    write(
        workdir,
        """\
        queues:
          - name: train
            description: new
            kind: priority
          - name: fresh
            provider: nowhere
        """,
    )

    stderr = refused(sh, workdir, "lakeshore apply -f lakeshore.yaml --dry-run")
    assert stderr.splitlines()[0] == (
        "error: lakeshore.yaml:4: queues[0].kind: cannot change (fifo → priority): "
        "remove and re-create it"
    )
    write(workdir, "queues:\n  - name: train\n  - name: fresh\n    provider: nowhere\n")
    stderr = refused(sh, workdir, "lakeshore apply -f lakeshore.yaml")
    assert stderr.startswith(
        "error: lakeshore.yaml:4: queues[1].provider: unknown provider 'nowhere'\n"
        "  queue fresh: Unknown provider 'nowhere'"
    )
    assert names() == ([], ["train"])


@pytest.mark.parametrize(
    "text, says",
    [
        ("queues:\n  - name: a\n   kind: fifo\n", "lakeshore.yaml:3: invalid YAML"),
        ("queues:\n  - name: a\n  - name: b\n    kind: [fifo\n", "lakeshore.yaml:5: invalid YAML"),
        ("", "lakeshore.yaml is empty"),
        ("# nothing yet\n", "lakeshore.yaml is empty"),
        ("- name: a\n", "lakeshore.yaml:1: the top level must be a mapping"),
        ("queues: []\nvolumes: []\n", "lakeshore.yaml:2: volumes: unknown key"),
        ("queues:\n  - name: a\n    name: b\n", "lakeshore.yaml:3: queues[0].name: given twice"),
        (
            "queues:\n  - name: a\n    description: 2024-01-02\n",
            "lakeshore.yaml:3: queues[0].description: 2024-01-02 reads as a date",
        ),
    ],
)
def test_a_file_it_cannot_read_is_refused_at_its_line(sh, workdir, text, says):
    write(workdir, text)

    stderr = refused(sh, workdir, "lakeshore apply -f lakeshore.yaml")

    assert stderr.startswith(f"error: {says}"), stderr


def test_a_missing_file_is_named(sh, workdir):
    stderr = refused(sh, workdir, "lakeshore apply -f nowhere.yaml")
    assert stderr.startswith("error: cannot read nowhere.yaml: No such file")


def test_it_reads_standard_input_and_prints_json(sh, workdir):
    write(workdir, LAKESHORE_YAML)

    result = sh.json(f"cd {workdir} && lakeshore apply -f - --dry-run --json < lakeshore.yaml")

    assert (result["dry_run"], result["applied"], result["up_to_date"]) == (True, False, False)
    assert [item["action"] for item in result["items"]] == ["create"] * 3
    stderr = refused(sh, workdir, "echo 'queues: [{name: a, kind: lifo}]' | lakeshore apply -f -")
    assert stderr.startswith("error: <stdin>:1: queues[0].kind: ")


def test_export_applies_as_up_to_date(sh, workdir):
    write(workdir, LAKESHORE_YAML)
    sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml")
    sh("lakeshore queues patch train --max 6 --description 'from the cli'")
    sh("lakeshore queues add warm --kind boltzmann --temperature 0.5 --max-depth 10")

    sh(f"cd {workdir} && lakeshore export > x.yaml")
    plan = sh(f"cd {workdir} && lakeshore apply -f x.yaml --dry-run --prune")

    assert plan.stdout.splitlines()[-1] == "Up to date: nothing to change."
    exported = yaml.safe_load((workdir / "x.yaml").read_text())
    assert [q["name"] for q in exported["queues"]] == ["eval", "train", "warm"]
    assert exported["queues"][1]["elasticity"] == {
        "kind": "pool_with_threshold",
        "min": 1,
        "max": 6,
        "threshold": 0.5,
    }
    assert exported == sh.json("lakeshore export --json")


def test_an_apply_while_another_runs_says_so_and_changes_nothing(sh, workdir):
    write(workdir, LAKESHORE_YAML)
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as another:  # holds the apply lock
        another.execute("SELECT pg_advisory_lock(hashtext(%s))", [declarative.APPLY_LOCK])
        stderr = refused(sh, workdir, "lakeshore apply -f lakeshore.yaml")

    assert stderr.splitlines() == [
        "error: Another apply is in progress; nothing was changed. Try again when it ends.",
        "another 'lakeshore apply' is running on the server: run this one again when it ends",
    ]
    assert names() == ([], [])
    sh(f"cd {workdir} && lakeshore apply -f lakeshore.yaml")  # control: alone, it applies
    assert names() == (["here"], ["eval", "train"])
