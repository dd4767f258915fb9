"""Text a job or a daemon wrote reaches the reader's terminal with its control characters
shown (as `cat -v` shows them), never acted on: the installed `lakeshore` command in a
shell, against a live server. `--json` keeps the exact text."""

import json
import time

import msgpack
import pytest
from django.test import Client

from tests.support import builders
from tests.support.job_logs import ECHO, client, ship

pytestmark = pytest.mark.django_db(transaction=True)

# Clear the screen, put "pwned" on the clipboard (OSC 52, ended by BEL), return to the
# line's start, and a C1 CSI (U+009B, ESC [ to a UTF-8 terminal), and DEL.
ATTACK = "a\x1b[2Jb\x1b]52;c;cHduZWQ=\x07c\rd\x9b31me\x7f"
SHOWN = "a^[[2Jb^[]52;c;cHduZWQ=^Gc^MdM-^[31me^?"


def _plain(text: str) -> bool:
    """No control character but newline and tab, and no C1 control."""
    return not any((ord(ch) < 0x20 and ch not in "\n\t") or 0x7F <= ord(ch) <= 0x9F for ch in text)


@pytest.fixture
def job(live_server):
    """A job keyed with the attack, that printed it and failed with it."""
    queue = builders.queue().name
    submitted = client(builders.token("operator")).post(
        "/api/v1/jobs/", {"function": ECHO, "queue": queue, "key": f"k {ATTACK}"}, format="json"
    )
    assert submitted.status_code == 201, submitted.content
    job = int(submitted.json()["id"])
    registered = client(builders.token("daemon")).post(
        "/api/v1/daemons/register/", {"name": "w", "queues": [queue]}, format="json"
    )
    assert registered.status_code == 201, registered.content
    me, daemon = registered.json()["id"], client(registered.json()["token"])
    daemon.post(f"/api/v1/daemons/{me}/claim/", {"limit": 1}, format="json")
    ship(daemon, me, job, [["o", time.time(), f"out {ATTACK}"], ["o", time.time(), "next"]])
    done = daemon.post(
        f"/api/v1/daemons/{me}/complete/",
        {
            "invocation": job,
            "attempt": 1,
            "state": "failed",
            "retry": False,
            "error": f"Traceback\n  boom {ATTACK}",
        },
        format="json",
    )
    assert done.status_code == 200, done.content
    return job


def test_a_jobs_log_is_shown_escaped_and_its_json_is_exact(sh, job):
    out = sh(f"lakeshore jobs logs {job}").stdout

    assert out == f"out {SHOWN}\nnext\n"  # one line a line: newlines stay line breaks
    exact = [
        json.loads(line) for line in sh(f"lakeshore jobs logs {job} --json").stdout.split("\n")[:-1]
    ]
    assert [line["text"] for line in exact] == [f"out {ATTACK}", "next"]


def test_a_jobs_error_and_key_are_shown_escaped_and_its_list_is_plain(sh, job):
    shown = sh(f"lakeshore jobs show {job}").stdout
    listed = sh("lakeshore jobs list").stdout

    assert f"  boom {SHOWN}\n" in shown
    assert f"k {SHOWN}\n" in shown
    assert _plain(shown) and _plain(listed)
    exact = sh.json(f"lakeshore jobs show {job} --json")
    assert exact["error"] == f"Traceback\n  boom {ATTACK}"
    assert exact["key"] == f"k {ATTACK}"


def test_a_queues_event_reason_is_shown_escaped(sh, live_server):
    """A provider's failure (here a simulated one's; sbatch's stderr on Slurm) is the
    reason of the queue's launch_failed event."""
    builders.provider(name="sim", kind="simulated", config={"fail": f"sbatch said {ATTACK}"})
    queue = builders.queue(name="q1", provider="sim", elasticity_spec={"kind": "fixed", "min": 1})
    assert builders.tick_queue(queue.pk).action == "launch_failed"

    out = sh("lakeshore queues events q1").stdout

    assert f"sbatch said {SHOWN}" in out
    assert _plain(out)
    assert f"sbatch said {ATTACK})" in sh.json("lakeshore queues events q1 --json")[0]["reason"]


def test_the_json_output_is_plain_on_a_terminal_and_decodes_exactly(sh, job):
    """A control in --json travels as a JSON escape: the C0 ones (json's own), and DEL
    and the C1 ones too; decoded, the text is what the job wrote."""
    raw = sh(f"lakeshore jobs show {job} --json").stdout

    assert _plain(raw.replace("\n", ""))
    assert "\\u009b" in raw and "\\u001b" in raw
    assert json.loads(raw)["error"].endswith(ATTACK)


def test_an_sdk_jobs_function_name_is_shown_escaped_in_the_list(sh, live_server):
    """An SDK job names its function in its Envelope (free text): `jobs list` shows it."""
    builders.queue(name="gpu")
    envelope = msgpack.packb(
        {
            "v": 1,
            "id": "01J",
            "fn": {"kind": "ref", "module": "pkg", "qualname": f"f{ATTACK}", "src_hash": "x"},
            "args": msgpack.packb([]),
            "kwargs": msgpack.packb({}),
        },
        use_bin_type=True,
    )
    submitted = Client().post(
        "/v1/namespaces/default/producer/submit",
        data=msgpack.packb(
            {"queue": "gpu", "args_blob": envelope, "run_config": {"queue": "gpu"}},
            use_bin_type=True,
        ),
        content_type="application/x-msgpack",
        HTTP_AUTHORIZATION=f"Bearer {builders.token('operator')}",
    )
    assert submitted.status_code == 201, submitted.content

    listed = sh("lakeshore jobs list").stdout

    assert f"pkg.f{SHOWN}" in listed and _plain(listed)
    assert sh.json("lakeshore jobs list --json")[0]["function"] == f"pkg.f{ATTACK}"
