"""The SDK's calls keep the server's rules (jobs/sdk.py over jobs/services.py): what
each route answers, byte for byte, without the SDK package in the way."""

import msgpack
import pytest

from fleet.models import Daemon
from jobs import sdk, services
from jobs.models import Invocation, ResultFrame
from queues import services as queue_services
from tests.support import builders
from tests.support.sdk_wire import ENVELOPE, answer_of

pytestmark = pytest.mark.django_db


def _call(api, path, body, token):
    answer = api.post(
        path,
        data=msgpack.packb(body, use_bin_type=True),
        content_type="application/x-msgpack",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    return answer.status_code, answer_of(answer)


SUBMIT = "/v1/namespaces/default/producer/submit"


@pytest.fixture
def operator():
    return builders.token("operator")


@pytest.fixture
def daemon_token():
    return builders.token("daemon")


def _submit(api, token, queue="gpu", blob=ENVELOPE, **run_config):
    return _call(api, SUBMIT, {"queue": queue, "args_blob": blob,
                               "run_config": {"queue": queue, **run_config}}, token)  # fmt: skip


def test_a_submit_is_an_ordinary_invocation_shown_with_its_function_and_size(api, operator):
    builders.queue(name="gpu")
    status, body = _submit(api, operator, priority=2.5, timeout_s=60)
    assert status == 201
    row = Invocation.objects.get(pk=int(body["invocation_id"]))
    assert (row.function, row.wire, row.priority, row.timeout_s) == (
        "pkg.mod.train",
        "envelope",
        2.5,
        60,
    )
    shown = api.get(f"/api/v1/jobs/{row.pk}/", HTTP_AUTHORIZATION=f"Bearer {operator}").json()
    assert (shown["function"], shown["args_bytes"], shown["priority"]) == (
        "pkg.mod.train",
        len(ENVELOPE),
        2.5,
    )
    listed = api.get("/api/v1/jobs/", HTTP_AUTHORIZATION=f"Bearer {operator}").json()
    assert listed[0]["args_bytes"] == len(ENVELOPE) and listed[0]["wire"] == "envelope"


def test_a_bare_value_is_a_value_invocation(api, operator):
    builders.queue(name="gpu")
    _, body = _submit(api, operator, blob=msgpack.packb({"x": 1}))
    row = Invocation.objects.get(pk=int(body["invocation_id"]))
    assert (row.wire, row.function) == ("value", sdk.VALUE_FUNCTION)


def test_admission_rules_apply_max_depth_and_unknown_queues(api, operator):
    builders.queue(name="gpu", max_depth=1)
    assert _submit(api, operator)[0] == 201
    status, body = _submit(api, operator)
    assert (status, body["error"]["code"]) == (429, "backlog_full")
    status, body = _submit(api, operator, queue="nowhere")
    assert (status, body["error"]["code"]) == (404, "not_found")


def test_this_projects_daemons_and_sdk_workers_take_only_what_they_can_run(
    api, operator, daemon_token
):
    builders.queue(name="gpu")
    _, body = _submit(api, operator)
    sdk_job = int(body["invocation_id"])
    json_job, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="gpu")
    ours = builders.daemon(queues=["gpu"])
    assert [i.pk for i in builders.claim(daemon=ours, limit=5)] == [json_job.pk]

    status, polled = _call(api, "/v1/daemon/poll", {"worker_id": "h-1", "queue": "gpu",
                                                     "timeout_s": 0}, daemon_token)  # fmt: skip
    assert status == 200
    [command] = polled["commands"]
    assert command["kind"] == "run"
    assert command["body"]["invocation_id"] == str(sdk_job)
    assert command["body"]["args_blob"] == ENVELOPE and command["body"]["attempt"] == 1
    assert Daemon.objects.get(worker_id="h-1").queues == ["gpu"]


def test_a_paused_queue_holds_sdk_work(api, operator, daemon_token):
    builders.queue(name="gpu")
    queue_services.queue_transition(name="gpu", action="pause")
    assert _submit(api, operator)[0] == 201  # paused admits
    _, polled = _call(api, "/v1/daemon/poll", {"worker_id": "h-1", "queue": "gpu",
                                                "timeout_s": 0}, daemon_token)  # fmt: skip
    assert polled == {"commands": []}


def test_an_ack_is_fenced_by_the_token_and_a_late_one_changes_nothing(api, operator, daemon_token):
    builders.queue(name="gpu")
    _, body = _submit(api, operator)
    inv = body["invocation_id"]
    _call(api, "/v1/daemon/poll", {"worker_id": "h-1", "queue": "gpu", "timeout_s": 0},
          daemon_token)  # fmt: skip
    other = builders.token("daemon")
    status, refused = _call(api, "/v1/daemon/ack", {"invocation_id": inv,
                                                     "state": "succeeded"}, other)  # fmt: skip
    assert (status, refused["reason"], refused["ignored"]) == (200, "claim_stale", True)
    assert Invocation.objects.get(pk=int(inv)).state == "running"  # the other token did nothing

    ok = {"invocation_id": inv, "state": "succeeded", "result_blob": b"\x2a"}
    assert _call(api, "/v1/daemon/ack", ok, daemon_token) == (200, {"state": "succeeded",
                                                                     "attempt": 1})  # fmt: skip
    late = {"invocation_id": inv, "state": "failed", "error": {"message": "x", "retry": True}}
    status, answer = _call(api, "/v1/daemon/ack", late, daemon_token)
    assert status == 200 and answer["ignored"] is True and answer["state"] == "succeeded"
    row = Invocation.objects.get(pk=int(inv))
    assert (row.state, bytes(row.result_blob)) == ("succeeded", b"\x2a")


def test_a_nack_without_retry_is_final_with_attempts_left(api, operator, daemon_token):
    builders.queue(name="gpu")
    _, body = _submit(api, operator)
    inv = body["invocation_id"]
    _call(api, "/v1/daemon/poll", {"worker_id": "h-1", "queue": "gpu", "timeout_s": 0},
          daemon_token)  # fmt: skip
    nack = {"invocation_id": inv, "state": "failed",
            "error": {"type": "WorkerError", "message": "E: no", "retry": False}}  # fmt: skip
    assert _call(api, "/v1/daemon/ack", nack, daemon_token)[1]["state"] == "failed"
    row = Invocation.objects.get(pk=int(inv))
    assert (row.state, row.attempts, row.max_attempts, row.error) == ("failed", 1, 3, "E: no")


def test_a_result_chunk_keeps_the_first_write_and_accepts_a_topic(api, daemon_token):
    first = {"invocation_id": "progress", "seq": 0, "bytes": b"one", "final": False}
    assert _call(api, "/v1/daemon/result-chunk", first, daemon_token) == (
        200,
        {"seq": 0, "duplicate": False},
    )
    again = {**first, "bytes": b"two"}
    assert _call(api, "/v1/daemon/result-chunk", again, daemon_token)[1]["duplicate"] is True
    assert bytes(ResultFrame.objects.get(stream="progress", seq=0).data) == b"one"


def test_await_answers_pending_at_its_timeout_and_404_for_an_unknown_id(api, operator):
    builders.queue(name="gpu")
    _, body = _submit(api, operator)
    path = "/v1/namespaces/default/producer/await"
    ask = {"invocation_id": body["invocation_id"], "timeout_s": 0.1}
    assert _call(api, path, ask, operator) == (
        200,
        {"state": "pending", "result_blob": None, "result_ref": None, "error": None},
    )
    assert _call(api, path, {"invocation_id": "999999999", "timeout_s": 0}, operator)[0] == 404


def test_a_body_that_is_not_msgpack_is_400_in_msgpack(api, operator):
    answer = api.post(SUBMIT, data=b"\xc1", content_type="application/x-msgpack",
                      HTTP_AUTHORIZATION=f"Bearer {operator}")  # fmt: skip
    assert answer.status_code == 400
    assert answer_of(answer)["error"]["code"] == "invalid"


def test_the_controller_counts_sdk_backlog_and_sdk_workers(api, operator, daemon_token):
    queue = builders.queue(name="gpu")
    _submit(api, operator)
    _submit(api, operator)
    _call(api, "/v1/daemon/poll", {"worker_id": "h-1", "queue": "gpu", "timeout_s": 0},
          daemon_token)  # fmt: skip
    signals = queue_services.queue_signals(queue)["signals"]
    assert (signals.pending, signals.daemons, signals.busy) == (1, 1, 1)


def test_a_stream_of_a_topic_nobody_posts_to_ends_after_the_idle_limit(api, operator, settings):
    settings.LAKESHORE_SDK_STREAM_IDLE_SECONDS = 0.3
    answer = api.get(
        "/v1/namespaces/default/producer/invocations/quiet-topic/result/stream",
        {"since": "-1"},
        HTTP_AUTHORIZATION=f"Bearer {operator}",
    )
    assert answer.status_code == 200
    assert b"".join(answer.streaming_content) == b""


def test_a_stream_sends_the_stored_frames_after_since_then_ends_at_the_final_one(
    api, operator, daemon_token
):
    frames = [msgpack.packb([0, i, {"i": i}, None]) for i in range(3)]
    for seq, frame in enumerate(frames):
        chunk = {"invocation_id": "t", "seq": seq, "bytes": frame, "final": seq == 2}
        _call(api, "/v1/daemon/result-chunk", chunk, daemon_token)
    answer = api.get(
        "/v1/namespaces/default/producer/invocations/t/result/stream",
        {"since": "0"},
        HTTP_AUTHORIZATION=f"Bearer {operator}",
    )
    assert b"".join(answer.streaming_content) == frames[1] + frames[2]
