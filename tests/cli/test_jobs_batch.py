"""`lakeshore jobs submit FUNCTION --batch FILE`: JSON lines queued in chunks through the
batch API, by the installed command against a live server. What the user sees (the
summary, --json, each error at its line, where to resume) and what the database then
holds."""

import json
import os
import pty
import re
import subprocess

import httpx
import pytest

from jobs.models import Invocation
from lakeshore.commands.job_batch import CHUNK_MAX_VALUES
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ECHO = "lakeshore.functions.echo"
SUBMIT = f"lakeshore jobs submit {ECHO}"
SUMMARY = re.compile(r"^(?P<counts>.+) in (?P<queue>\S+) in \d+\.\d s$")
RESUME = "(a key on each line makes a re-run safe)"


@pytest.fixture
def gpu():
    """The queue gpu, served by a live daemon: a submit prints no note about it."""
    builders.queue(name="gpu")
    builders.daemon(queues=["gpu"])
    return "gpu"


def write_lines(tmp_path, lines: list, name: str = "jobs.jsonl") -> str:
    """Each item as a line (a str as it is, anything else as JSON); the file's name."""
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    (tmp_path / name).write_text(text)
    return name


def summary(stdout: str) -> tuple[str, str]:
    """(`9 queued, 1 already existed (same key)`, `gpu`) from the one summary line."""
    lines = stdout.splitlines()
    assert len(lines) == 1, stdout
    found = SUMMARY.match(lines[0])
    assert found, lines[0]
    return found["counts"], found["queue"]


def stored(queue: str = "gpu") -> list[tuple]:
    rows = Invocation.objects.filter(queue=queue).order_by("id")
    return list(rows.values_list("args", "kwargs", "key", "priority"))


def test_it_queues_every_line_with_its_args_kwargs_key_and_priority(sh, gpu, tmp_path):
    name = write_lines(
        tmp_path,
        [
            {"args": [1, "one"], "key": "a", "priority": 5},
            "",
            {"kwargs": {"x": [1, {"y": None}]}, "priority": 2.5},
            "   ",
            {},
            '{"args": [4], "key": "d"}\r',
        ],
    )
    result = sh(
        f"cd {tmp_path} && {SUBMIT} --queue gpu --priority 7 --timeout 30 --max-attempts 3 "
        f"--batch {name}"
    )
    assert summary(result.stdout) == ("4 queued", "gpu")
    assert result.stderr == ""  # piped: no progress bar, and a daemon serves gpu
    assert stored() == [
        ([1, "one"], {}, "a", 5),
        ([], {"x": [1, {"y": None}]}, "", 2.5),
        ([], {}, "", 7),
        ([4], {}, "d", 7),
    ]
    rows = Invocation.objects.filter(queue="gpu")
    assert set(rows.values_list("function", "timeout_s", "max_attempts", "state")) == {
        (ECHO, 30, 3, "queued")
    }


def test_it_reads_standard_input_given_as_a_dash(sh, tmp_path):
    builders.daemon(queues=[])  # serves the default queue
    result = sh(f"printf '%s\\n' '{{\"args\": [1]}}' '{{\"args\": [2]}}' | {SUBMIT} --batch -")
    assert summary(result.stdout) == ("2 queued", "(default)")
    assert result.stderr == ""
    assert stored("") == [([1], {}, "", 0), ([2], {}, "", 0)]


def test_json_gives_the_counts_and_the_range_of_new_ids(sh, gpu, tmp_path):
    builders.queue(name="other")
    sh(f"{SUBMIT} --queue gpu --key k1")
    name = write_lines(tmp_path, [{"args": [n], "key": f"k{n}"} for n in range(1, 6)])
    answer = sh.json(f"cd {tmp_path} && {SUBMIT} --queue gpu --batch {name} --json")
    new = Invocation.objects.filter(queue="gpu").exclude(key="k1")
    ids = sorted(new.values_list("id", flat=True))
    assert set(answer) == {"queue", "queued", "existing", "first_id", "last_id", "seconds"}
    assert (answer["queue"], answer["queued"], answer["existing"]) == ("gpu", 4, 1)
    assert (answer["first_id"], answer["last_id"]) == (str(ids[0]), str(ids[-1]))
    assert isinstance(answer["seconds"], float) and answer["seconds"] >= 0
    default = sh.json(f"cd {tmp_path} && {SUBMIT} --batch {name} --json --chunk-size 2")
    assert (default["queue"], default["queued"], default["existing"]) == ("", 5, 0)


def test_a_rerun_with_keys_counts_the_lines_as_existing(sh, gpu, tmp_path):
    keyed = write_lines(tmp_path, [{"args": [n], "key": f"k{n}"} for n in range(3)], "keyed.jsonl")
    more = write_lines(
        tmp_path, [{"args": [n], "key": f"k{n}"} for n in range(5)] + [{"key": "k4"}], "more.jsonl"
    )
    first = sh(f"cd {tmp_path} && {SUBMIT} --queue gpu --batch {keyed}")
    again = sh(f"cd {tmp_path} && {SUBMIT} --queue gpu --batch {keyed}")
    grown = sh(f"cd {tmp_path} && {SUBMIT} --queue gpu --batch {more} --chunk-size 2")
    assert summary(first.stdout) == ("3 queued", "gpu")
    assert summary(again.stdout) == ("0 queued, 3 already existed (same key)", "gpu")
    # k4 twice in the input: its second line finds the first's job
    assert summary(grown.stdout) == ("2 queued, 4 already existed (same key)", "gpu")
    assert sorted(key for _, _, key, _ in stored()) == ["k0", "k1", "k2", "k3", "k4"]


def test_without_keys_a_rerun_queues_every_line_again(sh, gpu, tmp_path):
    """The negative control of the test above: what makes a re-run safe is the keys."""
    name = write_lines(tmp_path, [{"args": [n]} for n in range(3)])
    sh(f"cd {tmp_path} && {SUBMIT} --queue gpu --batch {name}")
    again = sh(f"cd {tmp_path} && {SUBMIT} --queue gpu --batch {name}")
    assert summary(again.stdout) == ("3 queued", "gpu")
    assert len(stored()) == 6


BAD_LINES = [
    ("{not json", "not JSON (Expecting property name enclosed in double quotes, column 2)"),
    ("[1, 2]", 'must be a JSON object such as {"args": [1]}, not an array'),
    ('{"kwargs": [1]}', "kwargs must be a JSON object, not an array"),
    ('{"args": {"a": 1}}', "args must be a JSON array, not an object"),
    ('{"key": 7}', "key must be a string, not a number"),
    ('{"priority": "high"}', "priority must be a number, not a string"),
    ('{"priority": true}', "priority must be a number, not true or false"),
    ('{"args": [NaN]}', "NaN is not a JSON number"),
    ('{"args": [1e400]}', "1e400 is too large for a number"),
    ('{"kwarg": {}}', "unknown key 'kwarg' (a line takes args, kwargs, key, priority)"),
    (
        '{"args": [1], "args": [2]}',
        "the name 'args' is given twice in one object: give it once",
    ),
]


@pytest.mark.parametrize(("line", "problem"), BAD_LINES)
def test_a_bad_line_of_a_file_is_refused_at_its_number_and_nothing_is_queued(
    sh, gpu, tmp_path, line, problem
):
    """The bad line is in the fourth chunk: the file is checked whole before a chunk
    is sent."""
    lines: list = [{"args": [n]} for n in range(1, 17)]
    lines[10] = ""  # a blank line counts in the numbers
    name = write_lines(tmp_path, [*lines, line, {"args": [18]}])
    result = sh(f"cd {tmp_path} && {SUBMIT} --queue gpu --batch {name} --chunk-size 5", exit=1)
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: jobs.jsonl:17: {problem}",
        "nothing was queued (jobs.jsonl is checked whole before a line is sent)",
    ]
    assert not Invocation.objects.exists()


def test_the_same_file_without_its_bad_line_is_queued_whole(sh, gpu, tmp_path):
    """The negative control of the test above: nothing else in that file is refused."""
    lines: list = [{"args": [n]} for n in range(1, 17)]
    lines[10] = ""
    name = write_lines(tmp_path, [*lines, {"args": [17]}, {"args": [18]}])
    result = sh(f"cd {tmp_path} && {SUBMIT} --queue gpu --batch {name} --chunk-size 5")
    assert summary(result.stdout) == ("17 queued", "gpu")


def test_on_standard_input_a_bad_line_stops_after_the_chunks_before_its_own(sh, gpu, tmp_path):
    lines = [json.dumps({"args": [n]}) for n in range(1, 13)] + ['{"kwargs": 3}', '{"args": [14]}']
    (tmp_path / "jobs.jsonl").write_text("\n".join(lines) + "\n")
    result = sh(
        f"cat {tmp_path}/jobs.jsonl | {SUBMIT} --queue gpu --batch - --chunk-size 5", exit=1
    )
    assert result.stderr.splitlines() == [
        "error: <stdin>:13: kwargs must be a JSON object, not a number",
        f"lines 1 to 10 were queued, nothing after: resume from line 11 {RESUME}",
    ]
    assert [args for args, _, _, _ in stored()] == [[n] for n in range(1, 11)]


def test_a_chunk_the_server_refuses_is_named_by_its_lines(sh, gpu, tmp_path):
    """The server's own checks (a key's length here) refuse a whole chunk: its items'
    errors are shown at their lines, and the chunks before it stay queued."""
    lines: list = [{"args": [n], "key": f"k{n}"} for n in range(1, 13)]
    lines[7] = {"args": [8], "key": "k" * 201}
    lines[8] = {"args": [9], "key": "k" * 202}
    name = write_lines(tmp_path, lines)
    result = sh(f"cd {tmp_path} && {SUBMIT} --queue gpu --batch {name} --chunk-size 5", exit=1)
    too_long = "Ensure this field has no more than 200 characters."
    assert result.stderr.splitlines() == [
        f"error: jobs.jsonl:8: key: {too_long}",
        f"  jobs.jsonl:9: key: {too_long}",
        f"lines 1 to 5 were queued, nothing after: resume from line 6 {RESUME}",
    ]
    assert [key for _, _, key, _ in stored()] == ["k1", "k2", "k3", "k4", "k5"]


def test_a_full_queue_refuses_the_chunk_past_its_room(sh, tmp_path):
    builders.queue(name="small", max_depth=7)
    builders.daemon(queues=["small"])
    name = write_lines(tmp_path, [{"args": [n]} for n in range(10)])
    result = sh(f"cd {tmp_path} && {SUBMIT} --queue small --batch {name} --chunk-size 5", exit=1)
    assert result.stderr.splitlines() == [
        "error: jobs.jsonl:6-10: Queue 'small' is full: 5 queued (max_depth 7, on_full=reject); "
        "this batch adds 5.",
        f"lines 1 to 5 were queued, nothing after: resume from line 6 {RESUME}",
    ]
    assert Invocation.objects.filter(queue="small").count() == 5


def test_an_unknown_queue_or_a_bad_function_is_said_once_by_its_flag(sh, tmp_path):
    name = write_lines(tmp_path, [{"args": [n]} for n in range(3)])
    unknown = sh(f"cd {tmp_path} && {SUBMIT} --queue nope --batch {name}", exit=1)
    private = sh(f"cd {tmp_path} && lakeshore jobs submit os._exit --batch {name}", exit=1)
    assert unknown.stderr.splitlines() == [
        "error: jobs.jsonl:1-3: Queue 'nope' does not exist.",
        "  --queue: unknown",
        "nothing was queued",
    ]
    assert private.stderr.splitlines()[0].startswith("error: jobs.jsonl:1-3: function 'os._exit'")
    assert private.stderr.splitlines()[1:] == [
        "  FUNCTION: a part starts with '_' (private or dunder)",
        "nothing was queued",
    ]
    assert not Invocation.objects.exists()


def test_a_flag_the_server_refuses_is_said_once_not_at_every_line(sh, gpu, tmp_path):
    name = write_lines(tmp_path, [{"args": [n]} for n in range(30)])
    result = sh(
        f"cd {tmp_path} && {SUBMIT} --queue gpu --timeout 3000000000 --batch {name}", exit=1
    )
    assert result.stderr.splitlines() == [
        "error: --timeout: Ensure this value is less than or equal to 2147483647.",
        "nothing was queued",
    ]
    assert not Invocation.objects.exists()


def test_batch_with_args_kwargs_or_key_is_a_usage_error(sh, gpu, tmp_path):
    name = write_lines(tmp_path, [{"args": [1]}])
    both = sh(f"cd {tmp_path} && {SUBMIT} --batch {name} --args '[]' --key k", exit=2)
    alone = sh(f"{SUBMIT} --chunk-size 5", exit=2)
    missing = sh(f"{SUBMIT} --batch {tmp_path}/absent.jsonl", exit=1)
    assert both.stderr.splitlines()[-1] == (
        "Error: --batch reads args, kwargs and key from each line: drop --args and --key"
    )
    assert alone.stderr.splitlines()[-1] == "Error: --chunk-size goes with --batch"
    assert (
        missing.stderr == f"error: cannot read {tmp_path}/absent.jsonl: No such file or directory\n"
    )
    assert not Invocation.objects.exists()


def test_chunks_stay_within_the_servers_bound_on_json_values(sh, gpu, tmp_path, live_server):
    """20 lines of 30,000 values each: one request would hold 600,000, past the server's
    500,000; the command sends them in chunks under CHUNK_MAX_VALUES."""
    lines = [{"args": [n], "kwargs": {"v": [0] * 30_000}} for n in range(20)]
    assert 20 * 30_000 > 500_000 > CHUNK_MAX_VALUES
    name = write_lines(tmp_path, lines)
    result = sh(f"cd {tmp_path} && {SUBMIT} --queue gpu --batch {name}")
    assert summary(result.stdout) == ("20 queued", "gpu")
    assert [args for args, _, _, _ in stored()] == [[n] for n in range(20)]
    # the negative control: the same lines in one request are refused
    whole = [{"function": ECHO, "queue": "gpu", **line} for line in lines]
    refused = httpx.post(
        f"{live_server.url}/api/v1/jobs/",
        json=whole,
        headers={"Authorization": f"Bearer {sh.env['LAKESHORE_TOKEN']}"},
        timeout=60,
    )
    assert refused.status_code == 400
    assert "LAKESHORE_JSON_MAX_VALUES" in refused.json()["error"]["message"]


def test_more_lines_than_one_request_holds_go_in_several(sh, tmp_path):
    """10,001 lines at the default chunk size: two requests, every line queued in order."""
    builders.daemon(queues=[])
    name = write_lines(tmp_path, [{"args": [n]} for n in range(10_001)])
    result = sh(f"cd {tmp_path} && {SUBMIT} --batch {name}")
    assert summary(result.stdout) == ("10,001 queued", "(default)")
    args = list(Invocation.objects.filter(queue="").order_by("id").values_list("args", flat=True))
    assert args == [[n] for n in range(10_001)]


def _with_stderr_on_a_terminal(sh, line: str) -> tuple[str, str]:
    """(stdout, what reached the terminal) of a command line run with stderr on a pty."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            ["bash", "-c", line],
            env=sh.env,
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            timeout=60,
        )
    finally:
        os.close(follower)
    seen = b""
    while True:
        try:
            read = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other side is closed and drained
            break
        if not read:
            break
        seen += read
    os.close(leader)
    assert done.returncode == 0, seen
    return done.stdout, seen.decode()


def test_a_terminal_shows_a_progress_bar_and_a_pipe_does_not(sh, gpu, tmp_path):
    name = write_lines(tmp_path, [{"args": [n]} for n in range(12)])
    command = f"cd {tmp_path} && {SUBMIT} --queue gpu --batch {name} --chunk-size 5"
    stdout, terminal = _with_stderr_on_a_terminal(sh, command)
    assert summary(stdout) == ("12 queued", "gpu")
    assert "checking  [" in terminal and "queueing  [" in terminal
    assert "12/12" in terminal and "100%" in terminal
    piped = sh(command)
    assert summary(piped.stdout) == ("12 queued", "gpu")
    assert piped.stderr == ""
    _, from_stdin = _with_stderr_on_a_terminal(sh, f"cat {name} | {SUBMIT} --queue gpu --batch -")
    assert "queueing  [" in from_stdin and "checking" not in from_stdin
