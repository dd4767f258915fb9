"""Every example of the cookbook's Queues section, run verbatim through bash with the real
installed `lakeshore` command against a live server."""

import shutil
import stat
import sys
from pathlib import Path

import pytest
import yaml
from django.utils import timezone

from queues.models import Queue, QueueEvent
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BIN = Path(sys.executable).parent
LAKESHORE = BIN / "lakeshore"
QUEUE_COLUMNS = ["NAME", "KIND", "STATE", "MEMBERS", "PROVIDER", "ELASTICITY", "DESCRIPTION"]

ADD_WITH_ELASTICITY = """\
lakeshore queues add training-h100 \\
  --kind priority \\
  --provider my-gpu-provider \\
  --elasticity pool-with-threshold \\
  --min 2 --max 16 --threshold 0.7 \\
  --instance-type p4d.24xlarge \\
  --max-depth 1000 --on-full reject
"""


@pytest.fixture
def cookbook_queues(sh):
    """The queues the cookbook's examples act on: eval and training-h100 (with elasticity)."""
    sh("lakeshore providers add my-gpu-provider --kind simulated")
    sh(ADD_WITH_ELASTICITY)
    sh('lakeshore queues add eval --kind priority --description "evaluation, urgent first"')


def header(stdout: str) -> list[str]:
    return stdout.splitlines()[0].split()


def rows(stdout: str) -> dict[str, str]:
    return {line.split()[0]: line for line in stdout.splitlines()[1:]}


class TestAdd:
    def test_it_adds_the_bare_minimum_and_a_described_priority_queue(self, sh):
        first = sh("lakeshore queues add training-h100")
        second = sh(
            'lakeshore queues add eval --kind priority --description "evaluation, urgent first"'
        )  # noqa: E501
        assert first.stdout == "queue/training-h100 created\n"
        assert second.stdout == "queue/eval created\n"
        queue = sh.json("lakeshore queues show training-h100 --json")
        assert (queue["kind"], queue["state"], queue["elasticity"]) == ("fifo", "active", None)
        evaluation = sh.json("lakeshore queues show eval --json")
        assert (evaluation["kind"], evaluation["description"]) == (
            "priority",
            "evaluation, urgent first",
        )

    def test_it_adds_a_queue_with_an_elasticity_declaration(self, sh):
        sh("lakeshore providers add my-gpu-provider --kind simulated")
        assert sh(ADD_WITH_ELASTICITY).stdout == "queue/training-h100 created\n"
        queue = sh.json("lakeshore queues show training-h100 --json")
        assert queue["elasticity"] == {
            "kind": "pool_with_threshold",
            "min": 2,
            "max": 16,
            "threshold": 0.7,
        }
        expected = {
            "kind": "priority",
            "provider": "my-gpu-provider",
            "instance_type": "p4d.24xlarge",
            "max_depth": 1000,
            "on_full": "reject",
        }
        assert {key: queue[key] for key in expected} == expected

    def test_it_refuses_the_yaml_spelling_of_an_elasticity_kind(self, sh):
        result = sh("lakeshore queues add q --elasticity pool_with_threshold", exit=2)
        assert (
            "Error: Invalid value for '--elasticity': 'pool_with_threshold' is the "
            "lakeshore.yaml spelling; the flag takes 'pool-with-threshold'." in result.stderr
        )

    def test_it_refuses_a_name_off_the_pattern(self, sh):
        assert "^[a-z0-9][a-z0-9-]*$" in sh("lakeshore queues add Training", exit=2).stderr

    def test_it_reports_the_servers_refusal_with_the_flag_names(self, sh):
        result = sh("lakeshore queues add q --elasticity max-count --min 1", exit=1)
        lines = result.stderr.splitlines()
        assert lines[0].startswith("error: ")
        assert any(line.startswith("  --min: ") for line in lines[1:])
        assert any(line.startswith("  --max: ") for line in lines[1:])

    def test_it_reports_a_duplicate(self, sh):
        sh("lakeshore queues add eval")
        assert sh("lakeshore queues add eval", exit=1).stderr.startswith("error: Queue 'eval'")


class TestLs:
    def test_it_lists_with_the_cookbook_columns(self, sh, cookbook_queues):
        result = sh("lakeshore queues ls")
        assert header(result.stdout) == QUEUE_COLUMNS
        found = rows(result.stdout)
        assert list(found) == ["eval", "training-h100"]
        assert found["eval"].split()[:5] == ["eval", "priority", "active", "0", "-"]
        assert found["eval"].endswith("   evaluation, urgent first")
        assert "   my-gpu-provider   pool-with-threshold 2..16 @0.7   " in found["training-h100"]

    def test_it_filters_on_state(self, sh, cookbook_queues):
        sh("lakeshore queues drain training-h100")
        assert list(rows(sh("lakeshore queues ls --state active").stdout)) == ["eval"]
        assert list(rows(sh("lakeshore queues ls --state draining").stdout)) == ["training-h100"]

    def test_it_pipes_json_to_jq(self, sh, cookbook_queues):
        if shutil.which("jq"):
            result = sh("lakeshore queues ls --json | jq -r '.[].name'")
            assert result.stdout == "eval\ntraining-h100\n"
        names = [q["name"] for q in sh.json("lakeshore queues ls --json")]
        assert names == ["eval", "training-h100"]

    def test_it_hides_archived_queues(self, sh, cookbook_queues):
        sh("lakeshore queues archive eval")
        assert list(rows(sh("lakeshore queues ls").stdout)) == ["training-h100"]
        assert list(rows(sh("lakeshore queues ls --state archived").stdout)) == ["eval"]

    def test_it_follows_the_servers_pages(self, sh):
        names = [f"q-{n:03}" for n in range(105)]  # the server's page is 100 rows
        for name in names:
            builders.queue(name)
        assert [q["name"] for q in sh.json("lakeshore queues ls --json")] == names
        assert list(rows(sh("lakeshore queues ls").stdout)) == names

    def test_it_says_when_there_are_none(self, sh):
        result = sh("lakeshore queues ls")
        assert (result.stdout, result.stderr) == ("", "No queues found.\n")
        assert sh.json("lakeshore queues ls --json") == []


class TestShow:
    def test_it_shows_a_queue_and_its_members(self, sh, cookbook_queues):
        builders.daemon(queues=["training-h100"], name="gpu-1")
        result = sh("lakeshore queues show training-h100")
        lines = result.stdout.splitlines()
        assert lines[0] == "Name:          training-h100"
        assert "Elasticity:    pool-with-threshold 2..16 @0.7" in lines
        assert "Members:       1" in lines
        assert header("\n".join(lines[-2:])) == [
            "ID",
            "NAME",
            "STATE",
            "QUEUES",
            "LAST",
            "HEARTBEAT",
        ]
        assert lines[-1].split()[1:4] == ["gpu-1", "idle", "training-h100"]

        queue = sh.json("lakeshore queues show training-h100 --json")
        assert queue["members"] == 1
        assert [d["name"] for d in queue["daemons"]] == ["gpu-1"]

    def test_it_reports_a_missing_queue(self, sh):
        result = sh("lakeshore queues show nope", exit=1)
        assert result.stderr == "error: Queue 'nope' does not exist.\n"


class TestPatch:
    def test_it_runs_the_cookbook_patches(self, sh, cookbook_queues):
        show = "lakeshore queues show training-h100 --json"
        sh('lakeshore queues patch training-h100 --description "h100 prod"')
        assert sh.json(show)["description"] == "h100 prod"

        sh("lakeshore queues patch training-h100 --max 32 --threshold 0.6")
        elasticity = sh.json(show)["elasticity"]
        assert (elasticity["max"], elasticity["threshold"]) == (32, 0.6)

        sh("lakeshore queues patch training-h100 --max-depth 2000 --on-full block")
        queue = sh.json(show)
        assert (queue["max_depth"], queue["on_full"]) == (2000, "block")

        result = sh('lakeshore queues patch training-h100 --provider ""    # clear the provider')
        assert result.stdout == "queue/training-h100 patched\n"
        assert sh.json(show)["provider"] in (None, "")

    def test_it_does_not_accept_kind_or_elasticity(self, sh, cookbook_queues):
        assert "immutable" in sh("lakeshore queues patch eval --kind fifo", exit=2).stderr
        sh("lakeshore queues patch eval --elasticity fixed", exit=2)

    def test_it_shows_the_desired_count_on_a_dry_run(self, sh, cookbook_queues):
        result = sh("lakeshore queues patch training-h100 --min 4 --dry-run")
        assert result.stdout == "dry run: desired daemons would be 4 (nothing saved)\n"
        assert sh.json("lakeshore queues show training-h100 --json")["elasticity"]["min"] == 2


class TestStateVerbs:
    def test_it_drains_archives_and_unarchives(self, sh, cookbook_queues):
        assert sh("lakeshore queues drain training-h100").stdout == "queue/training-h100 draining\n"
        assert sh("lakeshore queues archive eval").stdout == "queue/eval archived\n"
        assert sh("lakeshore queues unarchive eval").stdout == "queue/eval active\n"
        assert sh.json("lakeshore queues unarchive training-h100 --json")["state"] == "active"

    def test_it_pauses_and_resumes(self, sh, cookbook_queues):
        assert sh("lakeshore queues pause eval").stdout == "queue/eval paused\n"
        assert sh("lakeshore queues resume eval").stdout == "queue/eval active\n"

    def test_drain_wait_returns_once_nothing_is_left(self, sh, cookbook_queues):
        result = sh("lakeshore queues drain eval --wait --timeout 30")
        assert result.stdout == "queue/eval draining\nqueue/eval drained\n"
        assert "draining eval: 0 queued, 0 running" in result.stderr


class TestRm:
    def test_it_removes(self, sh, cookbook_queues):
        assert sh("lakeshore queues rm eval").stdout == "queue/eval deleted\n"
        assert "eval" not in rows(sh("lakeshore queues ls").stdout)

    def test_it_refuses_while_daemons_are_bound_unless_forced(self, sh, cookbook_queues):
        builders.daemon(queues=["eval", "training-h100"], name="bound-1")
        result = sh("lakeshore queues rm eval", exit=1)
        assert result.stderr.startswith("error: Queue 'eval' still has 1 bound daemon(s): bound-1")
        forced = sh("lakeshore queues rm eval --force")
        assert forced.stdout.startswith("queue/eval deleted")
        daemon = sh.json("lakeshore daemon list --json")[0]
        assert daemon["queues"] == ["training-h100"]


class TestEvents:
    @pytest.fixture
    def decisions(self, cookbook_queues):
        queue = Queue.objects.get(name="training-h100")
        common = {"queue": queue, "at": timezone.now(), "daemons": 2, "busy": 2}
        QueueEvent.objects.create(
            **common, action="tick_noop", reason="nothing to do", pending=0,
            utilization=1.0, desired=2, delta=0,
        )  # fmt: skip
        QueueEvent.objects.create(
            **common, action="scale_up", reason="U=1.00 ≥ 0.70, P=14: desired 5 → launching 3",
            pending=14, utilization=1.0, desired=5, delta=3,
        )  # fmt: skip

    def test_it_runs_the_cookbook_examples(self, sh, decisions):
        result = sh("lakeshore queues events training-h100")
        assert header(result.stdout)[:8] == ["AT", "ACTION", "D", "B", "P", "U", "DESIRED", "DELTA"]
        assert [line.split()[1] for line in result.stdout.splitlines()[1:]] == ["scale_up"]
        assert "+3" in result.stdout

        verbose = sh("lakeshore queues events training-h100 --verbose --limit 200")
        actions = [line.split()[1] for line in verbose.stdout.splitlines()[1:]]
        assert actions == ["scale_up", "tick_noop"]

        events = sh.json("lakeshore queues events training-h100 --json")
        assert [e["action"] for e in events] == ["scale_up"]
        assert set(events[0]) >= {"id", "at", "action", "reason", "desired", "delta"}

    def test_it_says_tick_noop_rows_are_hidden(self, sh, cookbook_queues):
        result = sh("lakeshore queues events eval")
        assert result.stderr == "No events (tick_noop rows are hidden; --verbose shows them).\n"

    def test_it_refuses_a_limit_over_200(self, sh, cookbook_queues):
        assert "'--limit'" in sh("lakeshore queues events eval --limit 201", exit=2).stderr


class TestStats:
    def test_it_runs_the_cookbook_examples(self, sh, cookbook_queues):
        result = sh("lakeshore queues stats training-h100")
        assert result.stdout.splitlines()[0].startswith("Daemons:")
        assert "Desired:" in result.stdout
        stats = sh.json("lakeshore queues stats training-h100 --json")
        keys = {"daemons", "busy", "idle", "provisioning", "utilization", "pending", "running"}
        assert set(stats) >= keys | {"desired", "next_action", "recent_actions"}


class TestProvidersAndDaemons:
    def test_providers_verbs(self, sh):
        sh("""lakeshore providers add sim --kind simulated --config '{"startup_seconds": 2}'""")
        assert header(sh("lakeshore providers list").stdout) == ["NAME", "KIND", "DESCRIPTION"]
        sh('lakeshore providers patch sim --description "for tests"')
        provider = sh.json("lakeshore providers show sim --json")
        assert (provider["description"], provider["config"]) == (
            "for tests",
            {"startup_seconds": 2},
        )
        assert sh("lakeshore providers remove sim").stdout == "provider/sim deleted\n"

    def test_providers_remove_names_the_queues_using_it(self, sh, cookbook_queues):
        result = sh("lakeshore providers remove my-gpu-provider", exit=1)
        assert "training-h100" in result.stderr

    def test_daemon_list_and_show(self, sh):
        daemon = builders.daemon(queues=[], name="default-worker")
        result = sh("lakeshore daemon list")
        assert header(result.stdout) == [
            "ID",
            "NAME",
            "STATE",
            "QUEUES",
            "PROVIDER",
            "LAST",
            "HEARTBEAT",
        ]  # noqa: E501
        assert result.stdout.splitlines()[1].split()[1:4] == ["default-worker", "idle", "(default)"]
        assert sh.json(f"lakeshore daemon show {daemon.pk} --json")["name"] == "default-worker"


class TestAuth:
    def test_login_saves_a_checked_token_owner_only(self, sh, tmp_path, operator_token):
        result = sh(f"echo {operator_token} | env -u LAKESHORE_TOKEN lakeshore auth login")
        auth_file = tmp_path / "lakeshore" / "auth.yml"
        assert str(auth_file) in result.stdout
        assert yaml.safe_load(auth_file.read_text())["token"] == operator_token
        assert stat.S_IMODE(auth_file.stat().st_mode) == 0o600
        status = sh("env -u LAKESHORE_TOKEN lakeshore auth status")
        assert f"(from {auth_file})" in status.stdout and "Accepted: yes" in status.stdout
        sh("env -u LAKESHORE_TOKEN lakeshore queues ls")
        sh("lakeshore auth logout")
        sh("env -u LAKESHORE_TOKEN lakeshore queues ls", exit=1)

    def test_a_bad_token_is_refused_with_a_hint_naming_where_it_came_from(self, sh):
        result = sh("LAKESHORE_TOKEN=lsk_wrong lakeshore queues ls", exit=1)
        assert result.stderr.startswith("error: Invalid token")
        assert "hint: the token in $LAKESHORE_TOKEN was refused" in result.stderr
        client = sh("LAKESHORE_CLIENT_TOKEN=lsk_wrong lakeshore queues ls", exit=1)
        assert "hint: the token in $LAKESHORE_CLIENT_TOKEN was refused" in client.stderr
        assert "set LAKESHORE_CLIENT_TOKEN to a valid token" in client.stderr
        flag = sh("lakeshore --token lsk_wrong queues ls", exit=1)
        assert "hint: the token given with --token was refused" in flag.stderr

    def test_an_unreachable_server_says_how_to_start_it(self, sh):
        result = sh("lakeshore --url http://127.0.0.1:9 queues ls", exit=1)
        assert result.stderr.startswith(
            "error: cannot reach the Lakeshore server at http://127.0.0.1:9 ("
        )
        assert "Start it with 'make run', or set --url / LAKESHORE_URL." in result.stderr
