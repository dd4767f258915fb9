"""`lakeshore queues …` without a server: what each verb sends and prints."""

import json

import httpx
import pytest

from lakeshore.commands import queues as queues_module
from tests.cli.fakes import queue_json


class TestAdd:
    def test_it_sends_only_the_name_by_default(self, fake_api):
        fake_api.on("POST", "queues/", status=201, json=queue_json("training-h100"))
        result = fake_api.run("queues", "add", "training-h100")
        assert result.exit_code == 0, result.output
        assert result.stdout == "queue/training-h100 created\n"
        assert fake_api.body() == {"name": "training-h100"}

    def test_it_sends_the_flags_given_with_underscored_elasticity(self, fake_api):
        fake_api.on("POST", "queues/", status=201, json=queue_json())
        result = fake_api.run(
            "queues", "add", "training-h100", "--kind", "priority", "--provider", "gpu",
            "--elasticity", "pool-with-threshold", "--min", "2", "--max", "16",
            "--threshold", "0.7", "--instance-type", "p4d.24xlarge", "--image-id", "ami-1",
            "--runner", "python", "--max-depth", "1000", "--on-full", "reject",
            "--temperature", "0.5", "--description", "",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert fake_api.body() == {
            "name": "training-h100",
            "kind": "priority",
            "description": "",
            "provider": "gpu",
            "elasticity": {"kind": "pool_with_threshold", "min": 2, "max": 16, "threshold": 0.7},
            "instance_type": "p4d.24xlarge",
            "image_id": "ami-1",
            "runner": "python",
            "max_depth": 1000,
            "on_full": "reject",
            "temperature": 0.5,
        }

    @pytest.mark.parametrize(
        ("underscored", "hyphenated"),
        [
            ("pool_with_threshold", "pool-with-threshold"),
            ("fully_elastic", "fully-elastic"),
            ("max_count", "max-count"),
        ],
    )
    def test_it_refuses_the_yaml_spelling_of_elasticity(self, fake_api, underscored, hyphenated):
        result = fake_api.run("queues", "add", "q", "--elasticity", underscored)
        assert result.exit_code == 2
        assert (
            f"Error: Invalid value for '--elasticity': '{underscored}' is the lakeshore.yaml "
            f"spelling; the flag takes '{hyphenated}'." in result.stderr
        )
        assert fake_api.requests == []

    def test_it_lists_the_elasticity_kinds_for_an_unknown_one(self, fake_api):
        result = fake_api.run("queues", "add", "q", "--elasticity", "bursty")
        assert result.exit_code == 2
        assert "fixed" in result.stderr and "pool-with-threshold" in result.stderr

    @pytest.mark.parametrize("name", ["Upper", "-lead", "under_score", "a" * 64, "sp ace"])
    def test_it_refuses_a_bad_name(self, fake_api, name):
        result = fake_api.run("queues", "add", "--", name)
        assert result.exit_code == 2
        assert "^[a-z0-9][a-z0-9-]*$" in result.stderr
        assert fake_api.requests == []

    def test_it_wants_an_elasticity_kind_for_its_numbers(self, fake_api):
        result = fake_api.run("queues", "add", "q", "--max", "3")
        assert result.exit_code == 2
        assert (
            "--min/--max/--threshold describe an elasticity declaration: add --elasticity KIND"
            in result.stderr
        )

    @pytest.mark.parametrize("threshold", ["0", "1.5", "-0.1"])
    def test_it_refuses_a_threshold_outside_0_to_1(self, fake_api, threshold):
        args = ["--elasticity", "pool-with-threshold", "--threshold", threshold]
        result = fake_api.run("queues", "add", "q", *args)
        assert result.exit_code == 2

    def test_it_prints_the_json_with_json(self, fake_api):
        fake_api.on("POST", "queues/", status=201, json=queue_json("eval"))
        result = fake_api.run("queues", "add", "eval", "--json")
        assert json.loads(result.stdout) == queue_json("eval")
        assert result.stdout.startswith('{\n  "name": "eval"')

    def test_its_help_lists_the_allowed_values(self, fake_api):
        help_text = fake_api.run("queues", "add", "--help").stdout
        for word in ["fifo|priority|boltzmann|filo", "fixed|fully-elastic|pool-with-threshold|"]:
            assert word in help_text
        assert "0.0–1.0" in help_text and "reject|block" in help_text


class TestLs:
    def test_it_prints_the_cookbook_columns_in_order(self, fake_api):
        pool = {"kind": "pool_with_threshold", "min": 2, "max": 16, "threshold": 0.7}
        rows = [
            queue_json("eval", kind="priority", description="evaluation, urgent first"),
            queue_json("training-h100", provider="my-gpu", members=3, elasticity=pool),
        ]
        fake_api.on("GET", "queues/", json=rows)
        result = fake_api.run("queues", "ls")
        assert result.exit_code == 0
        assert result.stdout.splitlines() == [
            "NAME            KIND       STATE    MEMBERS   PROVIDER   ELASTICITY                       DESCRIPTION",  # noqa: E501
            "eval            priority   active   0         -          -                                evaluation, urgent first",  # noqa: E501
            "training-h100   fifo       active   3         my-gpu     pool-with-threshold 2..16 @0.7   -",  # noqa: E501
        ]  # fmt: skip

    def test_it_follows_next_links_to_the_end(self, fake_api):
        next_page = '<http://testserver/api/v1/queues/?cursor=abc>; rel="next"'
        fake_api.on(
            "GET",
            "queues/",
            httpx.Response(200, json=[queue_json("a")], headers={"Link": next_page}),
            httpx.Response(200, json=[queue_json("b")]),
        )
        result = fake_api.run("queues", "ls", "--json")
        assert [q["name"] for q in json.loads(result.stdout)] == ["a", "b"]
        assert fake_api.requests[1].url.params["cursor"] == "abc"

    def test_it_filters_on_state(self, fake_api):
        fake_api.on("GET", "queues/", json=[])
        fake_api.run("queues", "ls", "--state", "archived")
        assert fake_api.last.url.params["state"] == "archived"

    def test_it_refuses_an_unknown_state(self, fake_api):
        assert fake_api.run("queues", "ls", "--state", "gone").exit_code == 2

    def test_it_says_so_when_there_are_none(self, fake_api):
        fake_api.on("GET", "queues/", json=[])
        result = fake_api.run("queues", "ls")
        assert (result.exit_code, result.stdout, result.stderr) == (0, "", "No queues found.\n")
        assert fake_api.run("queues", "ls", "--json").stdout == "[]\n"


class TestShow:
    def test_it_prints_the_queue_and_its_members(self, fake_api):
        daemon = {
            "id": "7",
            "name": "d-7",
            "queues": ["training-h100", "eval"],
            "state": "idle",
            "provider": None,
            "last_heartbeat_at": "2026-01-02T03:04:05Z",
        }
        fake_api.on("GET", "queues/training-h100/", json=queue_json(members=1, daemons=[daemon]))
        result = fake_api.run("queues", "show", "training-h100")
        assert result.exit_code == 0
        lines = result.stdout.splitlines()
        assert lines[0] == "Name:          training-h100"
        assert "Max depth:     unbounded" in lines
        assert lines[-2:] == [
            "ID   NAME   STATE   QUEUES               LAST HEARTBEAT",
            "7    d-7    idle    training-h100,eval   2026-01-02T03:04:05Z",
        ]

    def test_it_says_when_there_are_no_members(self, fake_api):
        fake_api.on("GET", "queues/q/", json=queue_json("q", daemons=[]))
        assert fake_api.run("queues", "show", "q").stdout.endswith("\nNo member daemons.\n")


class TestPatch:
    def test_it_sends_only_the_flags_given(self, fake_api):
        fake_api.on("PATCH", "queues/training-h100/", json=queue_json())
        result = fake_api.run(
            "queues", "patch", "training-h100", "--max", "32", "--threshold", "0.6"
        )
        assert (result.exit_code, result.stdout) == (0, "queue/training-h100 patched\n")
        assert fake_api.body() == {"elasticity": {"max": 32, "threshold": 0.6}}

    def test_it_clears_the_provider_with_an_empty_string(self, fake_api):
        fake_api.on("PATCH", "queues/q/", json=queue_json("q"))
        fake_api.run("queues", "patch", "q", "--provider", "")
        assert fake_api.body() == {"provider": ""}

    def test_it_refuses_to_patch_nothing(self, fake_api):
        result = fake_api.run("queues", "patch", "q")
        assert result.exit_code == 2
        assert "nothing to patch: give at least one of --description" in result.stderr

    @pytest.mark.parametrize(("flag", "value"), [("--kind", "fifo"), ("--elasticity", "fixed")])
    def test_it_does_not_accept_kind_or_elasticity(self, fake_api, flag, value):
        result = fake_api.run("queues", "patch", "q", flag, value)
        assert result.exit_code == 2
        assert f"queues patch cannot change {flag}" in result.stderr
        assert flag not in fake_api.run("queues", "patch", "--help").stdout

    def test_it_shows_the_desired_count_on_a_dry_run(self, fake_api):
        fake_api.on("PATCH", "queues/q/", json=queue_json("q", desired=5))
        result = fake_api.run("queues", "patch", "q", "--max", "5", "--dry-run")
        assert result.stdout == "dry run: desired daemons would be 5 (nothing saved)\n"
        assert fake_api.last.url.params["dry_run"] == "true"


class TestStateVerbs:
    @pytest.mark.parametrize(
        ("verb", "state"),
        [
            ("drain", "draining"),
            ("archive", "archived"),
            ("unarchive", "active"),
            ("pause", "paused"),
            ("resume", "active"),
        ],
    )
    def test_it_posts_the_verb_and_prints_the_new_state(self, fake_api, verb, state):
        fake_api.on("POST", f"queues/eval/{verb}/", json=queue_json("eval", state=state))
        result = fake_api.run("queues", verb, "eval")
        assert (result.exit_code, result.stdout) == (0, f"queue/eval {state}\n")
        assert json.loads(fake_api.run("queues", verb, "eval", "--json").stdout)["state"] == state


def stats(pending: int, running: int) -> httpx.Response:
    return httpx.Response(200, json={"pending": pending, "running": running})


class TestDrainWait:
    @pytest.fixture(autouse=True)
    def no_sleep(self, monkeypatch):
        monkeypatch.setattr(queues_module, "POLL_SECONDS", 0)

    def test_it_waits_until_nothing_is_queued_or_running(self, fake_api):
        fake_api.on("POST", "queues/q/drain/", json=queue_json("q", state="draining"))
        fake_api.on("GET", "queues/q/stats/", stats(3, 1), stats(3, 1), stats(0, 1), stats(0, 0))
        result = fake_api.run("queues", "drain", "q", "--wait")
        assert result.exit_code == 0
        assert result.stdout == "queue/q draining\nqueue/q drained\n"
        assert result.stderr.splitlines() == [
            "draining q: 3 queued, 1 running",
            "draining q: 0 queued, 1 running",
            "draining q: 0 queued, 0 running",
        ]

    def test_it_updates_one_line_on_a_terminal(self, fake_api, monkeypatch):
        monkeypatch.setattr(queues_module, "stderr_is_tty", lambda: True)
        fake_api.on("POST", "queues/q/drain/", json=queue_json("q", state="draining"))
        fake_api.on("GET", "queues/q/stats/", stats(3, 1), stats(1, 1), stats(0, 0))
        result = fake_api.run("queues", "drain", "q", "--wait")
        assert result.exit_code == 0
        assert result.stderr.count("\n") == 1
        updates = result.stderr.rstrip("\n").split("\r")[1:]
        assert [u.split("  [")[0] for u in updates] == [
            "draining q: 3 queued, 1 running",
            "draining q: 1 queued, 1 running",
            "draining q: 0 queued, 0 running",
        ]
        assert updates[1].startswith("draining q: 1 queued, 1 running  [##########..........]")

    def test_it_gives_up_after_the_timeout(self, fake_api, monkeypatch):
        fake_api.on("POST", "queues/q/drain/", json=queue_json("q", state="draining"))
        fake_api.on("GET", "queues/q/stats/", stats(2, 0))
        clock = iter(range(0, 1000, 5))
        monkeypatch.setattr(queues_module.time, "monotonic", lambda: next(clock))
        result = fake_api.run("queues", "drain", "q", "--wait", "--timeout", "10")
        assert result.exit_code == 1
        assert "error: queue q is not drained after 10 s (2 queued, 0 running)" in result.stderr

    def test_it_exits_130_on_ctrl_c(self, fake_api, monkeypatch):
        fake_api.on("POST", "queues/q/drain/", json=queue_json("q", state="draining"))
        fake_api.on("GET", "queues/q/stats/", stats(1, 1))

        def interrupt(seconds):
            raise KeyboardInterrupt

        monkeypatch.setattr(queues_module.time, "sleep", interrupt)
        result = fake_api.run("queues", "drain", "q", "--wait")
        assert result.exit_code == 130
        assert "interrupted: queue q is still draining (1 queued, 1 running)" in result.stderr

    def test_it_wants_wait_for_a_timeout(self, fake_api):
        assert fake_api.run("queues", "drain", "q", "--timeout", "5").exit_code == 2


class TestRm:
    def test_it_deletes(self, fake_api):
        fake_api.on("DELETE", "queues/eval/", httpx.Response(204))
        result = fake_api.run("queues", "rm", "eval")
        assert (result.exit_code, result.stdout) == (0, "queue/eval deleted\n")
        assert "force" not in fake_api.last.url.params

    def test_it_forces(self, fake_api):
        body = {"name": "eval", "deleted": True, "unbound_daemons": 2, "killed": 3}
        fake_api.on("DELETE", "queues/eval/", json=body)
        result = fake_api.run("queues", "rm", "eval", "--force")
        assert fake_api.last.url.params["force"] == "true"
        assert result.stdout == (
            "queue/eval deleted (unbound from 2 daemon(s), 3 queued invocation(s) killed)\n"
        )
        assert json.loads(fake_api.run("queues", "rm", "eval", "--force", "--json").stdout) == body

    def test_it_reports_bound_daemons(self, fake_api):
        message = "Queue 'eval' has bound daemons: d-1 (1). Use --force."
        error = {"code": "conflict", "message": message, "fields": {}}
        fake_api.on("DELETE", "queues/eval/", status=409, json={"error": error})
        result = fake_api.run("queues", "rm", "eval")
        assert (result.exit_code, result.stderr) == (1, f"error: {message}\n")


def event(action="scale_up", delta=2, **overrides):
    return {
        "id": "1",
        "at": "2026-01-02T03:04:05Z",
        "action": action,
        "reason": "U=0.92 ≥ 0.70, P=14: desired 5 → launching 2",
        "daemons": 3,
        "busy": 3,
        "pending": 14,
        "utilization": 0.92,
        "desired": 5,
        "delta": delta,
        **overrides,
    }


class TestEvents:
    def test_it_prints_the_audit_trail(self, fake_api):
        fake_api.on("GET", "queues/q/events/", json=[event(), event("tick_noop", 0)])
        result = fake_api.run("queues", "events", "q")
        assert result.stdout.splitlines() == [
            "AT                     ACTION      D   B   P    U      DESIRED   DELTA   REASON",
            "2026-01-02T03:04:05Z   scale_up    3   3   14   0.92   5         +2      U=0.92 ≥ 0.70, P=14: desired 5 → launching 2",  # noqa: E501
            "2026-01-02T03:04:05Z   tick_noop   3   3   14   0.92   5         0       U=0.92 ≥ 0.70, P=14: desired 5 → launching 2",  # noqa: E501
        ]  # fmt: skip
        assert dict(fake_api.last.url.params) == {"limit": "50"}

    def test_it_asks_for_tick_noop_rows_with_verbose(self, fake_api):
        fake_api.on("GET", "queues/q/events/", json=[])
        fake_api.run("queues", "events", "q", "--verbose", "--limit", "200")
        assert dict(fake_api.last.url.params) == {"limit": "200", "verbose": "true"}

    @pytest.mark.parametrize("limit", ["0", "201", "-1"])
    def test_it_refuses_a_limit_outside_1_to_200(self, fake_api, limit):
        result = fake_api.run("queues", "events", "q", "--limit", limit)
        assert result.exit_code == 2
        assert "Invalid value for '--limit'" in result.stderr
        assert fake_api.requests == []

    def test_it_says_tick_noop_rows_are_hidden_when_empty(self, fake_api):
        fake_api.on("GET", "queues/q/events/", json=[])
        result = fake_api.run("queues", "events", "q")
        assert result.stderr == "No events (tick_noop rows are hidden; --verbose shows them).\n"

    def test_its_help_gives_the_limit_range_and_default(self, fake_api):
        help_text = " ".join(fake_api.run("queues", "events", "--help").stdout.split())
        assert "1–200" in help_text and "default: 50" in help_text


def test_stats_prints_the_signals_and_recent_actions(fake_api):
    body = {
        "daemons": 3,
        "busy": 3,
        "idle": 0,
        "provisioning": 0,
        "utilization": 1.0,
        "pending": 14,
        "running": 3,
        "desired": 5,
        "next_action": "scale_up +2",
        "recent_actions": [event()],
    }
    fake_api.on("GET", "queues/q/stats/", json=body)
    lines = fake_api.run("queues", "stats", "q").stdout.splitlines()
    assert lines[:9] == [
        "Daemons:      3",
        "Busy:         3",
        "Idle:         0",
        "Provisioning: 0",
        "Utilization:  1.00",
        "Pending:      14",
        "Running:      3",
        "Desired:      5",
        "Next action:  scale_up +2",
    ]
    assert lines[10] == "Recent actions:"
    assert lines[11].startswith("AT ")


@pytest.mark.parametrize(
    "verb",
    ["add", "ls", "show", "patch", "archive", "unarchive", "drain", "rm", "events", "stats",
     "pause", "resume"],
)  # fmt: skip
def test_every_verb_takes_json(fake_api, verb):
    result = fake_api.run("queues", verb, "--help")
    assert result.exit_code == 0
    assert "--json" in result.stdout


def test_the_group_has_no_list_or_remove(fake_api):
    assert fake_api.run("queues", "list").exit_code == 2
    assert fake_api.run("queues", "remove", "q").exit_code == 2


def test_stats_and_events_of_the_default_queue_are_asked_as_default(fake_api):
    fake_api.on("GET", "queues/(default)/stats/", json={"daemons": 0, "recent_actions": []})
    assert fake_api.run("queues", "stats", "").exit_code == 0
    fake_api.on("GET", "queues/(default)/events/", json=[])
    result = fake_api.run("queues", "events", "", "--verbose")
    assert result.exit_code == 0 and "No events." in result.stderr
