"""`jobs submit --batch` when a chunk gets no answer (the server timed out or the
connection dropped): the chunk may or may not have been queued, and the error says
so, with the lines before it that were. The API is answered by a stand-in, which can
lose an answer on purpose."""

import json

import httpx
from click.testing import CliRunner

from lakeshore.cli import cli
from lakeshore.context import State


def test_a_chunk_without_an_answer_is_said_to_be_unsure_and_where_to_resume(tmp_path):
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if len(sent) > 1:
            raise httpx.ReadTimeout("timed out", request=request)
        items = json.loads(request.content)
        return httpx.Response(
            201, json=[{"id": str(n), "created": True, "hint": ""} for n, _ in enumerate(items)]
        )

    (tmp_path / "jobs.jsonl").write_text("".join(f'{{"args": [{n}]}}\n' for n in range(1, 6)))
    result = CliRunner().invoke(
        cli,
        ["jobs", "submit", "lakeshore.functions.echo", "--queue", "gpu", "--timeout", "9"]
        + ["--batch", str(tmp_path / "jobs.jsonl"), "--chunk-size", "2"],
        obj=State(transport=httpx.MockTransport(answer)),
    )
    assert result.exit_code == 1
    assert result.stderr.splitlines()[1:] == [
        "lines 1 to 2 were queued; lines 3 to 4 may have been queued or not (no answer "
        "came): resume from line 3 (a key on each line makes a re-run safe)"
    ]
    assert "did not answer in time" in result.stderr.splitlines()[0]
    assert [request.headers["Content-Type"] for request in sent] == ["application/json"] * 2
    assert json.loads(sent[0].content) == [
        {
            "function": "lakeshore.functions.echo",
            "queue": "gpu",
            "args": [n],
            "kwargs": {},
            "key": "",
            "priority": 0,
            "timeout_s": 9,
            "max_attempts": 1,
        }
        for n in (1, 2)
    ]
