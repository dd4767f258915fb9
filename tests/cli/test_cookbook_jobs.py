"""Every example of the cookbook's Jobs section, run verbatim through bash with the real
installed `lakeshore` command against a live server."""

import shutil

import pytest

from jobs import services
from jobs.models import Invocation
from queues.services import queue_transition
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

needs_jq = pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
JOB_COLUMNS = ["ID", "QUEUE", "FUNCTION", "STATE", "WORKER", "ATTEMPTS", "PRIORITY", "CREATED"]


@pytest.fixture
def backlog():
    """45 invocations in training-h100, the newest two claimed by a daemon."""
    builders.queue(name="training-h100", kind="priority")
    Invocation.objects.bulk_create(
        [Invocation(queue="training-h100", function="lakeshore.functions.echo") for _ in range(45)]
    )
    daemon = builders.daemon(queues=["training-h100"])
    Invocation.objects.filter(pk__in=Invocation.objects.order_by("-id").values("id")[:2]).update(
        state="running", daemon=daemon, attempts=1
    )
    return daemon


def _ids(stdout: str) -> list[str]:
    return [line.split()[0] for line in stdout.splitlines()[1:]]


def test_jobs_list(sh, backlog):
    out = sh("lakeshore jobs list").stdout
    assert out.splitlines()[0].split() == JOB_COLUMNS
    newest = [str(pk) for pk in Invocation.objects.order_by("-id").values_list("id", flat=True)]
    assert _ids(out) == newest[:50]


def test_jobs_list_with_limit_and_offset(sh, backlog):
    out = sh("lakeshore jobs list --limit 20 --offset 20").stdout
    newest = [str(pk) for pk in Invocation.objects.order_by("-id").values_list("id", flat=True)]
    assert _ids(out) == newest[20:40]


def test_jobs_list_filters_by_repeated_state(sh, backlog):
    out = sh("lakeshore jobs list --state running --state queued").stdout
    assert len(_ids(out)) == 45
    running = sh("lakeshore jobs list --state running").stdout
    assert len(_ids(running)) == 2 and " running " in running


def test_jobs_list_by_worker(sh, backlog):
    sh.env["D"] = str(backlog.pk)
    out = sh('lakeshore jobs list --worker "$D"').stdout
    assert len(_ids(out)) == 2
    assert all(line.split()[4] == str(backlog.pk) for line in out.splitlines()[1:])


@needs_jq
def test_jobs_list_json_through_jq(sh, backlog):
    out = sh("lakeshore jobs list --json | jq '.[] | {id, state, worker}'").stdout
    assert out.count('"state"') == 45
    assert f'"worker": "{backlog.pk}"' in out


@needs_jq
def test_jobs_show_kill_of_the_newest(sh, backlog):
    newest = Invocation.objects.order_by("-id").first()
    Invocation.objects.filter(pk=newest.pk).update(state="queued", daemon=None)
    script = """JOB=$(lakeshore jobs list --json | jq -r '.[0].id // empty')
lakeshore jobs show "$JOB"
"""
    out = sh(script).stdout
    assert "ID:" in out and str(newest.pk) in out
    assert "Position:" in out and "ahead" in out
    killed = sh(
        """JOB=$(lakeshore jobs list --json | jq -r '.[0].id // empty')
lakeshore jobs kill "$JOB"
"""
    ).stdout
    assert killed.strip() == f"job/{newest.pk} killed"
    newest.refresh_from_db()
    assert newest.state == "killed"


def test_jobs_kill_of_a_running_job_says_to_drop_the_daemon(sh, backlog):
    running = Invocation.objects.filter(state="running").first()
    result = sh(f"lakeshore jobs kill {running.pk}", exit=1)
    assert "drop the daemon" in result.stderr and "lakeshore daemon remove" in result.stderr
    assert result.stderr.startswith("error: ")


def test_jobs_bulk_cancel(sh, backlog):
    out = sh("lakeshore jobs bulk-cancel").stdout
    assert out.strip() == "cancelled 43 queued invocation(s)"
    assert Invocation.objects.filter(state="running").count() == 2


def test_jobs_bulk_cancel_one_queue(sh, backlog):
    services.invocation_submit(function="lakeshore.functions.echo")  # the default queue
    out = sh("lakeshore jobs bulk-cancel --queue training-h100").stdout
    assert out.strip() == "cancelled 43 queued invocation(s) in queue training-h100"
    assert Invocation.objects.filter(queue="", state="queued").count() == 1


def test_jobs_bulk_cancel_json(sh, backlog):
    assert sh.json("lakeshore jobs bulk-cancel --json") == {
        "cancelled": 43,
        "dry_run": False,
        "queue": None,
    }


def test_jobs_bulk_cancel_dry_run_changes_nothing(sh, backlog):
    out = sh("lakeshore jobs bulk-cancel --dry-run").stdout
    assert out.strip() == "would cancel 43 queued invocation(s)"
    assert Invocation.objects.filter(state="queued").count() == 43


@pytest.mark.parametrize(
    "line",
    [
        "lakeshore jobs list --limit 0",
        "lakeshore jobs list --limit 201",
        "lakeshore jobs list --offset -1",
        "lakeshore jobs list --state done",
        'lakeshore jobs list --worker ""',
        "lakeshore jobs submit lakeshore.functions.echo --args '{\"a\": 1}'",
    ],
)
def test_bad_usage_exits_2(sh, line):
    result = sh(line, exit=2)
    assert "Error" in result.stderr


def test_jobs_submit_then_show(sh):
    builders.queue(name="eval")
    out = sh(
        "lakeshore jobs submit lakeshore.functions.echo --queue eval --priority 3 "
        "--args '[1, 2]' --kwargs '{\"x\": 1}' --key nightly"
    ).stdout
    inv = Invocation.objects.get()
    assert out.strip() == f"job/{inv.pk} queued in eval"
    again = sh("lakeshore jobs submit lakeshore.functions.echo --queue eval --key nightly").stdout
    assert "already exists" in again and Invocation.objects.count() == 1
    shown = sh.json(f"lakeshore jobs show {inv.pk} --json")
    assert (shown["args"], shown["kwargs"], shown["priority"]) == ([1, 2], {"x": 1}, 3)
    assert shown["position"] == {"ahead": 0, "exact": True, "capped": False}


def test_jobs_submit_into_a_draining_queue_is_refused(sh):
    builders.queue(name="eval")
    queue_transition(name="eval", action="drain")
    result = sh("lakeshore jobs submit lakeshore.functions.echo --queue eval", exit=1)
    assert "draining" in result.stderr


def test_jobs_show_of_an_sdk_invocation_gives_its_blobs_sizes(sh):
    builders.queue(name="py")
    inv, _ = services.invocation_submit(
        function="hello_udfs.add",
        queue="py",
        wire="envelope",
        args_blob=b"\x01" * 1234,
        priority=5.5,
    )
    sh.env["J"] = str(inv.pk)
    out = sh('lakeshore jobs show "$J"').stdout
    assert "Function: hello_udfs.add" in out
    assert "Args:     1,234 bytes (SDK envelope, msgpack)" in out
    assert "Priority: 5.5" in out


def test_submit_into_a_queue_nothing_serves_says_how_to_start_a_daemon(sh):
    builders.queue(name="gpu")
    done = sh("lakeshore jobs submit lakeshore.functions.echo --queue gpu")
    assert done.stdout.startswith("job/") and "queued in gpu" in done.stdout
    assert "No live daemon serves queue gpu" in done.stderr
    assert "'lakeshore daemon run --queues gpu'" in done.stderr
    default = sh("lakeshore jobs submit lakeshore.functions.echo")
    assert "No live daemon serves the default queue" in default.stderr
    assert "'lakeshore daemon run'" in default.stderr
    answer = sh.json("lakeshore jobs submit lakeshore.functions.echo --json")  # stdout: JSON
    assert answer["hint"].startswith("No live daemon serves the default queue")


def test_submit_right_after_starting_a_daemon_in_the_background_says_nothing_more(sh):
    """The README's order: `daemon run … &`, then at once `jobs submit`. The daemon is
    still registering as the job is queued: the CLI looks again before it would tell the
    user to start the daemon they just started."""
    builders.queue(name="gpu")
    done = sh(
        "lakeshore daemon run --queues gpu >/dev/null 2>&1 & D=$!; "
        "lakeshore jobs submit lakeshore.functions.echo --queue gpu; S=$?; "
        "kill $D; wait $D; exit $S"
    )
    assert done.stdout.startswith("job/") and done.stderr == ""


def test_submit_into_a_served_or_elastic_queue_says_nothing_more(sh):
    builders.queue(name="gpu")
    builders.daemon(queues=["gpu"])
    builders.daemon(queues=[])
    builders.provider(name="sim")
    builders.queue(name="elastic", provider="sim", elasticity_spec={"kind": "fully_elastic"})
    for where in ("--queue gpu", "", "--queue elastic"):
        done = sh(f"lakeshore jobs submit lakeshore.functions.echo {where}")
        assert done.stderr == "" and done.stdout.startswith("job/")
