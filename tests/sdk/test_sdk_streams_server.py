"""Issue 29, items 9 and 10, against `make run`'s server (gunicorn's uvicorn worker, on
the test database), with the real SDK (dreamlake-lakeshore) as producer and worker.

9. A stream is its writer's: a topic takes frames only from the credential that opened
   it (a stranger's frame, a `final` one too, is refused 403 stream_not_yours and
   leaves no trace), and one credential's topics together hold at most
   LAKESHORE_SDK_TOPIC_BYTES_PER_CREDENTIAL (413 stream_full), however many topics
   (the probe: a token scoped to one queue filled topic after topic). The controls: the
   owner writes and ends its topic, and another credential still has its own room.
10. A retry writes its own stream: a generator whose first attempt raises after one
   value, then succeeds, streams the second attempt's values to a reader that opened
   before the first attempt ran and to one that opens after, though the first
   attempt's ERROR frame, final, sits at the seq the retry's second value took. The
   control: when the last attempt fails too, its ERROR ends the stream, and the SDK
   raises it."""

import sys
import threading

import httpx
import msgpack
import pytest

from accounts.services import token_create
from jobs.models import Invocation, ResultFrame
from queues.models import Queue
from tests.sdk.conftest import ROOT
from tests.support import builders
from tests.support.sdk_wire import answer_of
from tests.support.servers import environment, gunicorn

dls = pytest.importorskip("dreamlake.lakeshore")
from dreamlake.lakeshore.dispatch import DispatchError  # noqa: E402

from tests.support import sdk_udfs  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

KIB = 1024
FRAME = 64 * KIB
TOPICS_HOLD = 4  # frames of FRAME bytes one credential's topics hold together here
ERROR, VALUE = 4, 0  # the SDK's frame kinds


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_setup):
    """One server for the module, on the test database (django_db_setup made it)."""
    tmp_path = tmp_path_factory.mktemp("sdk-streams")
    env = environment(
        tmp_path,
        LAKESHORE_WEB_WORKERS="1",
        LAKESHORE_RETRY_BACKOFF="0",  # a retry is claimed at once
        LAKESHORE_SDK_STREAM_IDLE_SECONDS="10",
        LAKESHORE_SDK_TOPIC_BYTES_PER_CREDENTIAL=str(TOPICS_HOLD * FRAME),
    )
    with gunicorn(tmp_path, env) as (base, _):
        yield base


def _scoped_daemon_token(username: str) -> str:
    """A daemon token scoped to one queue, as in the probe."""
    if not Queue.objects.filter(name="q1").exists():
        builders.queue(name="q1")
    return token_create(username=username, role="daemon", queues=["q1"])[1]


def _chunk(base: str, token: str, stream: str, seq: int, data: bytes, final: bool = False):
    """POST /v1/daemon/result-chunk as the SDK sends it: (status, decoded answer)."""
    body = {"invocation_id": stream, "seq": seq, "bytes": data, "final": final}
    response = httpx.post(
        f"{base}/v1/daemon/result-chunk",
        content=msgpack.packb(body, use_bin_type=True),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/x-msgpack"},
        timeout=30,
    )
    return response.status_code, answer_of(response)


def _frame(kind: int, seq: int, body=None) -> bytes:
    return msgpack.packb([kind, seq, body, None], use_bin_type=True)


# ---------------------------------------------------------------------------- 9: topics


def test_a_topic_takes_frames_only_from_the_credential_that_opened_it(server):
    owner, stranger = _scoped_daemon_token("ana"), _scoped_daemon_token("bob")
    posted = dls.HttpDispatch(server, token=owner, timeout=30)
    topic = dls.Topic("team-progress", posted)
    assert topic.post({"step": 1}) == 0
    # the stranger's END (final) into it, and a frame at a seq of its own: refused
    for seq, final in ((1, True), (7, False)):
        status, answer = _chunk(server, stranger, "team-progress", seq, _frame(3, seq), final)
        assert (status, answer["error"]["code"]) == (403, "stream_not_yours")
    # nothing of it was kept: the owner's frame at that seq is written, not a duplicate
    assert topic.post({"step": 2}) == 1
    assert topic.post(None, final=True) == 2
    reader = dls.HttpDispatch(server, token=builders.token("operator"), timeout=30)
    assert list(dls.Topic("team-progress", reader).stream(timeout=20)) == [
        {"step": 1},
        {"step": 2},
    ]
    kept = ResultFrame.objects.filter(stream="team-progress").values_list("seq", flat=True)
    assert sorted(kept) == [0, 1, 2]
    # control: the stranger opens and ends a topic of its own
    assert _chunk(server, stranger, "bobs-topic", 0, _frame(3, 0), final=True)[0] == 200
    posted.close()
    reader.close()


def test_one_credentials_topics_together_hold_at_most_its_budget(server):
    writer = _scoped_daemon_token("ana")
    data = b"x" * FRAME
    answers = [_chunk(server, writer, f"topic-{i}", 0, data) for i in range(TOPICS_HOLD + 2)]
    assert [status for status, _ in answers] == [200] * TOPICS_HOLD + [413, 413]
    assert answers[TOPICS_HOLD][1]["error"]["code"] == "stream_full"
    assert "LAKESHORE_SDK_TOPIC_BYTES_PER_CREDENTIAL" in answers[TOPICS_HOLD][1]["error"]["message"]
    assert ResultFrame.objects.filter(stream__startswith="topic-").count() == TOPICS_HOLD
    # each topic alone is far below its own bound (LAKESHORE_SDK_STREAM_MAX_BYTES):
    # what stops the writer is its credential's total; another credential has its own
    other = _scoped_daemon_token("bob")
    assert _chunk(server, other, "topic-of-bob", 0, data)[0] == 200


# ---------------------------------------------------------------------------- 10: retries


@pytest.fixture
def worker(server, tmp_path, processes):
    """Start the SDK's own worker on `gpu` against the server."""
    builders.queue(name="gpu", kind="priority")
    token = builders.token("daemon")

    def start():
        command = [sys.executable, "-m", "dreamlake.lakeshore.daemon", "--url", server]
        command += ["--token", token, "--queue", "gpu"]
        env = {"PYTHONPATH": str(ROOT), "LAKESHORE_HOME": str(tmp_path / "home")}
        return processes(command, name="worker", env=env, cwd=tmp_path)

    return start


@pytest.fixture
def dp(server):
    dispatch = dls.HttpDispatch(server, token=builders.token("operator"), timeout=30)
    yield dispatch
    dispatch.close()


def _read_in_thread(server: str, inv: str) -> tuple[threading.Thread, dict]:
    """A reader of the invocation's stream in a thread of its own (its own client): it
    opens now and reads to the stream's end; ({"values"} or {"raised"})."""
    seen: dict = {}

    def read():
        reader = dls.HttpDispatch(server, token=builders.token("operator"), timeout=30)
        try:
            seen["values"] = list(dls.SyncQueue("gpu", dispatch=reader).stream(inv, timeout=30))
        except Exception as exc:  # noqa: BLE001 - what the SDK user would see
            seen["raised"] = f"{type(exc).__name__}: {exc}"
        finally:
            reader.close()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, seen


def test_a_retry_streams_its_own_frames_to_a_reader_that_opened_before_it(
    server, dp, worker, tmp_path
):
    inv = sdk_udfs.count_failing_first.submit(3, str(tmp_path / "ran-once"), _dispatch=dp)
    thread, live = _read_in_thread(server, inv)  # open while the job waits for a worker
    worker()
    q = dls.SyncQueue("gpu", dispatch=dp)
    assert q.result(inv, timeout=60) is None  # a generator's result: its key manifest
    thread.join(60)
    assert live == {"values": [{"i": 0}, {"i": 1}, {"i": 2}]}
    row = Invocation.objects.get(pk=int(inv))
    assert (row.state, row.attempts) == ("succeeded", 2)
    assert list(q.stream(inv, timeout=20)) == [{"i": 0}, {"i": 1}, {"i": 2}]  # opened after
    # the first attempt's frames are kept apart: its VALUE 0, then its ERROR, final, at
    # seq 1, the seq the retry's second value took (when frames were keyed by invocation
    # only, the first write of a seq won, and that ERROR ended every reader's stream)
    first = ResultFrame.objects.filter(stream=inv, attempt=1).order_by("seq")
    assert [(f.seq, f.final, msgpack.unpackb(f.data)[0]) for f in first] == [
        (0, False, VALUE),
        (1, True, ERROR),
    ]


def test_control_when_the_last_attempt_fails_its_error_ends_the_stream(server, dp, worker):
    inv = sdk_udfs.count_failing.submit(3, _dispatch=dp)
    thread, live = _read_in_thread(server, inv)
    worker()
    q = dls.SyncQueue("gpu", dispatch=dp)
    with pytest.raises(DispatchError, match="attempt fails after 1"):
        q.result(inv, timeout=60)
    thread.join(60)
    assert live == {"raised": f"DispatchError: stream {inv}: producer raised "
                    "RuntimeError: attempt fails after 1"}  # fmt: skip
    row = Invocation.objects.get(pk=int(inv))
    assert (row.state, row.attempts) == ("failed", 2)
    with pytest.raises(DispatchError, match="producer raised RuntimeError"):
        list(q.stream(inv, timeout=20))
