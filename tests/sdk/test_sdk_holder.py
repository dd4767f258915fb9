"""On the SDK's wire the token that polled an attempt holds it (issue 17, finding 5):
only that token acks it or writes its result stream, and a late ack after the lease
moved to another token changes nothing. Streams are bounded in frames and bytes, and
reads of them in bytes. Each attack has a negative control with the rule before."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.services import token_create
from fleet import sdk_worker
from fleet.models import Daemon
from jobs import sdk, sdk_frames
from jobs.models import Invocation, InvocationState, ResultFrame, ResultStream
from jobs.retention import retention_sweep
from jobs.transitions import rescue
from lakeshore_admin.errors import Forbidden
from tests.sdk.test_sdk_rules import SUBMIT, _call
from tests.support import builders
from tests.support.sdk_wire import ENVELOPE

pytestmark = [pytest.mark.django_db, pytest.mark.security]


def owner_rule(pk, token):
    """The holder rule before issue 17: any token of the worker's user, for whatever
    attempt is current."""
    invocation = Invocation.objects.select_related("daemon").get(pk=pk)
    if invocation.state != InvocationState.RUNNING or invocation.daemon is None:
        return None
    return invocation if invocation.daemon.owner_id == token.user_id else None


@pytest.fixture
def world(settings):
    """One SDK invocation polled by worker w1 (token one); two tokens of one user, as a
    team that gave each worker pool its own token."""
    settings.LAKESHORE_RETRY_BACKOFF = 0
    builders.queue(name="gpu")
    _, one = token_create(username="team", role="daemon")
    _, two = token_create(username="team", role="daemon")
    _, status_body = _call_submit()
    inv = status_body["invocation_id"]
    status, polled = _poll(one, "w1")
    assert status == 200 and polled["commands"][0]["body"]["invocation_id"] == inv
    return inv, one, two


def _call_submit():
    body = {"queue": "gpu", "args_blob": ENVELOPE, "run_config": {}}
    return _call(APIClient(), SUBMIT, body, builders.token("operator"))


def _poll(token, worker):
    return _call(APIClient(), "/v1/daemon/poll", {"worker_id": worker, "queue": "gpu",
                                                  "timeout_s": 0}, token)  # fmt: skip


def _post(path, body, token):
    return _call(APIClient(), path, body, token)


def _move_lease_to(worker, token, inv):
    """The lease of w1 expired: its attempt goes back to the queue and `worker`,
    polling with `token`, takes the next attempt."""
    Daemon.objects.filter(worker_id="w1").update(state="lost")
    rescue.requeue_daemon_work(
        daemon_ids=list(Daemon.objects.filter(worker_id="w1").values_list("pk", flat=True)),
        reason="lease expired",
    )
    status, polled = _poll(token, worker)
    assert polled["commands"][0]["body"]["attempt"] == 2
    assert Invocation.objects.get(pk=int(inv)).daemon.worker_id == worker


def test_a_late_ack_after_the_lease_moved_to_another_token_changes_nothing(world):
    inv, one, two = world
    _move_lease_to("w2", two, inv)
    status, answer = _post("/v1/daemon/ack", {"invocation_id": inv, "state": "succeeded",
                                              "result_blob": b"late"}, one)  # fmt: skip
    assert status == 200 and (answer["ignored"], answer["reason"]) == (True, "claim_stale")
    row = Invocation.objects.get(pk=int(inv))
    assert (row.state, row.attempts, row.result_blob) == ("running", 2, None)
    # the holder's own ack is taken
    status, answer = _post("/v1/daemon/ack", {"invocation_id": inv, "state": "succeeded",
                                              "result_blob": b"ok"}, two)  # fmt: skip
    assert answer == {"state": "succeeded", "attempt": 2}


def test_negative_control_under_the_old_fence_the_late_ack_completes_the_retry(world, monkeypatch):
    inv, one, two = world
    _move_lease_to("w2", two, inv)
    monkeypatch.setattr(sdk_worker, "_held_by", owner_rule)
    _post("/v1/daemon/ack", {"invocation_id": inv, "state": "succeeded",
                             "result_blob": b"late"}, one)  # fmt: skip
    row = Invocation.objects.get(pk=int(inv))
    assert (row.state, bytes(row.result_blob)) == ("succeeded", b"late")


def test_another_token_cannot_write_or_end_an_invocations_stream(world):
    inv, one, _ = world
    stranger = builders.token("daemon")
    forged = {"invocation_id": inv, "seq": 0, "bytes": b"forged", "final": True}
    status, answer = _post("/v1/daemon/result-chunk", forged, stranger)
    assert status == 200 and (answer["ignored"], answer["reason"]) == (True, "claim_stale")
    assert not ResultFrame.objects.filter(stream=inv).exists()  # nothing written first
    # the holder's frame at that seq is the one kept
    status, answer = _post("/v1/daemon/result-chunk", {**forged, "bytes": b"real"}, one)
    assert answer == {"seq": 0, "duplicate": False}
    assert bytes(ResultFrame.objects.get(stream=inv).data) == b"real"


def test_nobody_writes_ahead_into_an_invocation_that_does_not_exist_yet(world):
    inv, one, _ = world
    ahead = str(int(inv) + 1)
    early = {"invocation_id": ahead, "seq": 0, "bytes": b"x", "final": True}
    status, answer = _post("/v1/daemon/result-chunk", early, one)
    assert (status, answer["error"]["code"]) == (404, "not_found")
    assert not ResultFrame.objects.filter(stream=ahead).exists()


def test_negative_control_without_the_holder_check_a_stranger_forges_the_result(world, monkeypatch):
    inv, _, _ = world
    monkeypatch.setattr(sdk_worker, "_held_by", lambda pk, token: Invocation.objects.get(pk=pk))
    forged = {"invocation_id": inv, "seq": 0, "bytes": b"forged", "final": True}
    _post("/v1/daemon/result-chunk", forged, builders.token("daemon"))
    assert bytes(ResultFrame.objects.get(stream=inv).data) == b"forged"


# ---------------------------------------------------------------------------- bounds


def test_a_stream_holds_at_most_its_frames_and_bytes(settings):
    settings.LAKESHORE_SDK_STREAM_MAX_FRAMES = 3
    settings.LAKESHORE_SDK_STREAM_MAX_BYTES = 2048
    operator = builders.token("operator")
    for seq in range(3):
        assert _post("/v1/daemon/result-chunk", {"invocation_id": "topic", "seq": seq,
                                                 "bytes": b"x"}, operator)[0] == 200  # fmt: skip
    status, full = _post("/v1/daemon/result-chunk", {"invocation_id": "topic", "seq": 3,
                                                     "bytes": b"x"}, operator)  # fmt: skip
    assert (status, full["error"]["code"]) == (413, "stream_full")
    assert ResultFrame.objects.filter(stream="topic").count() == 3
    status, full = _post("/v1/daemon/result-chunk", {"invocation_id": "other", "seq": 0,
                                                     "bytes": b"y" * 2049}, operator)  # fmt: skip
    assert (status, full["error"]["code"]) == (413, "stream_full")


def test_negative_control_with_no_cap_the_stream_grows(settings):
    settings.LAKESHORE_SDK_STREAM_MAX_FRAMES = 10**9
    operator = builders.token("operator")
    for seq in range(5):
        _post("/v1/daemon/result-chunk", {"invocation_id": "topic", "seq": seq, "bytes": b"x"},
              operator)  # fmt: skip
    assert ResultFrame.objects.filter(stream="topic").count() == 5


def test_a_read_of_a_stream_loads_frames_within_its_byte_budget(settings):
    settings.LAKESHORE_SDK_STREAM_READ_BYTES = 3000
    for seq in range(6):
        ResultFrame.objects.create(stream="t", seq=seq, data=b"z" * 1000)
    assert [seq for seq, _, _ in sdk._next_frames("t", 0, -1)] == [0, 1, 2]
    assert [seq for seq, _, _ in sdk._next_frames("t", 0, 2)] == [3, 4, 5]
    ResultFrame.objects.create(stream="big", seq=0, data=b"z" * 5000)  # alone over budget
    ResultFrame.objects.create(stream="big", seq=1, data=b"z")
    assert [seq for seq, _, _ in sdk._next_frames("big", 0, -1)] == [0]
    settings.LAKESHORE_SDK_STREAM_READ_BYTES = 10**9  # negative control: no budget
    assert len(sdk._next_frames("t", 0, -1)) == 6


def test_the_holder_renews_its_lease_with_a_chunk(world):
    inv, one, _ = world
    Daemon.objects.filter(worker_id="w1").update(last_heartbeat_at="2000-01-01T00:00Z")
    _post("/v1/daemon/result-chunk", {"invocation_id": inv, "seq": 0, "bytes": b"x"}, one)
    assert Daemon.objects.get(worker_id="w1").last_heartbeat_at.year > 2000


def test_a_streams_totals_go_with_its_frames_at_retention(settings):
    operator = builders.token("operator")
    _post("/v1/daemon/result-chunk", {"invocation_id": "old", "seq": 0, "bytes": b"x"}, operator)
    _post("/v1/daemon/result-chunk", {"invocation_id": "new", "seq": 0, "bytes": b"x"}, operator)
    long_ago = timezone.now() - timedelta(days=settings.LAKESHORE_RETENTION_DAYS + 1)
    ResultStream.objects.filter(stream="old").update(updated_at=long_ago)
    ResultFrame.objects.filter(stream="old").update(created_at=long_ago)
    counts = retention_sweep()
    assert (counts["frames"], counts["streams"]) == (1, 1)
    assert list(ResultStream.objects.values_list("stream", flat=True)) == ["new"]


# ---------------------------------------------------------------------------- issue 29: topics


def _topic_frames(token, count, size, prefix="topic"):
    return [
        _post(
            "/v1/daemon/result-chunk",
            {"invocation_id": f"{prefix}-{i}", "seq": 0, "bytes": b"x" * size},
            token,
        )[0]  # fmt: skip
        for i in range(count)
    ]


def test_negative_control_with_no_budget_one_credential_fills_topic_after_topic(settings):
    """What tests/sdk/test_sdk_streams_server.py refuses past 4 frames is the credential's
    budget: raised out of reach, the same writer's topics all take their frames."""
    settings.LAKESHORE_SDK_TOPIC_BYTES_PER_CREDENTIAL = 10**12
    assert _topic_frames(builders.token("daemon"), 6, 64 * 1024) == [200] * 6


def test_a_credentials_topic_budget_comes_back_as_retention_sweeps_its_topics(settings):
    settings.LAKESHORE_SDK_TOPIC_BYTES_PER_CREDENTIAL = 4096
    writer = builders.token("daemon")
    assert _topic_frames(writer, 3, 2048) == [200, 200, 413]
    long_ago = timezone.now() - timedelta(days=settings.LAKESHORE_RETENTION_DAYS + 1)
    ResultStream.objects.filter(stream="topic-0").update(updated_at=long_ago)
    ResultFrame.objects.filter(stream="topic-0").update(created_at=long_ago)
    assert retention_sweep()["streams"] == 1
    assert _topic_frames(writer, 1, 2048, prefix="again") == [200]  # topic-0's room
    assert _topic_frames(writer, 1, 2048, prefix="more") == [413]


def test_a_session_writes_no_topic():
    """A console session has no credential to count a topic's frames against."""
    with pytest.raises(Forbidden):
        sdk_frames.insert_frame("topic", 0, b"x", False)
