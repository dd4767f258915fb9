"""The real Python SDK (dreamlake-lakeshore 0.5.0, pinned) against a live server: its
producer in this process, its worker (`python -m dreamlake.lakeshore.daemon`) as a
subprocess. What the SDK user sees is what is asserted."""

import os
import signal
import sys
import time
from datetime import timedelta

import httpx
import msgpack
import pytest
from django.test import override_settings

from fleet import daemons
from fleet.models import Daemon
from jobs import services
from jobs.models import Invocation
from queues import services as queue_services
from tests.sdk.conftest import ROOT
from tests.support import builders
from tests.support.sdk_wire import answer_of
from tests.support.waiting import wait_for

dls = pytest.importorskip("dreamlake.lakeshore")
from dreamlake.lakeshore.dispatch import DispatchError  # noqa: E402

from tests.support import sdk_udfs  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def gpu():
    return builders.queue(name="gpu", kind="priority")


@pytest.fixture
def operator_token():
    return builders.token("operator")


@pytest.fixture
def dp(live_server, operator_token):
    dispatch = dls.HttpDispatch(live_server.url, token=operator_token, timeout=30)
    yield dispatch
    dispatch.close()


@pytest.fixture
def worker(live_server, tmp_path, processes):
    """Start the SDK's own worker on a queue (killed at the end if still running)."""
    token = builders.token("daemon")

    def start(*flags, queue="gpu"):
        command = [sys.executable, "-m", "dreamlake.lakeshore.daemon", "--url", live_server.url]
        command += ["--token", token, "--queue", queue, *flags]
        env = {"PYTHONPATH": str(ROOT), "LAKESHORE_HOME": str(tmp_path / "home")}
        return processes(command, name="worker", env=env, cwd=tmp_path)

    return start


def test_a_udf_call_by_reference_runs_and_its_result_comes_back(gpu, dp, worker):
    inv = sdk_udfs.add.submit(40, 2, _dispatch=dp)
    worker()
    assert dls.SyncQueue("gpu", dispatch=dp).result(inv, timeout=30) == {
        "sum": 42,
        "pair": (40, 2),
    }
    row = Invocation.objects.get(pk=int(inv))  # the id the SDK holds is ours
    assert (row.state, row.function, row.wire, row.attempts) == (
        "succeeded",
        "tests.support.sdk_udfs.add",
        "envelope",
        1,
    )
    daemon = Daemon.objects.get(pk=row.daemon_id)
    assert daemon.worker_id and daemon.queues == ["gpu"] and daemon.name == daemon.worker_id


def test_a_failure_reaches_result_with_its_message(gpu, dp, worker):
    inv = sdk_udfs.boom.submit(0, _dispatch=dp)
    worker()
    with pytest.raises(DispatchError, match="ZeroDivisionError: division by zero"):
        dls.SyncQueue("gpu", dispatch=dp).result(inv, timeout=30)
    row = Invocation.objects.get(pk=int(inv))
    # the stock worker retries once (retry = attempt <= 1), then says the failure is final
    assert (row.state, row.attempts) == ("failed", 2)
    assert "ZeroDivisionError" in row.error


def test_a_generator_streams_its_frames_with_and_without_since(gpu, dp, worker):
    q = dls.SyncQueue("gpu", dispatch=dp)
    inv = sdk_udfs.count.submit(3, _dispatch=dp)
    worker()
    assert q.result(inv, timeout=30) is None  # non-key yields: no manifest
    assert list(q.stream(inv)) == [{"i": 0, "sq": 0}, {"i": 1, "sq": 1}, {"i": 2, "sq": 4}]
    assert list(q.stream(inv, since=1)) == [{"i": 2, "sq": 4}]


def test_a_stream_that_attaches_before_the_first_frame_gets_every_frame_live(gpu, dp, worker):
    q = dls.SyncQueue("gpu", dispatch=dp)
    inv = sdk_udfs.slow_count.submit(3, 0.4, _dispatch=dp)
    frames = q.stream(inv, timeout=30)
    worker()
    seen, stamps = [], []
    for value in frames:  # attached before the worker even started
        seen.append(value)
        stamps.append(time.monotonic())
    assert seen == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert stamps[-1] - stamps[0] >= 0.6  # they came as they were made, not at the end


def test_an_idempotent_key_answers_the_same_invocation(gpu, dp):
    q = dls.SyncQueue("gpu", dispatch=dp)
    first = q.submit({"x": 1}, key="scene7/x")
    again = q.submit({"x": 2}, key="scene7/x")
    assert first == again
    assert Invocation.objects.filter(queue="gpu", key="scene7/x").count() == 1


def test_a_thunk_is_refused_by_a_worker_without_allow_pickled_then_runs_with_it(gpu, dp, worker):
    q = dls.SyncQueue("gpu", dispatch=dp)
    inv = q.submit(dls.thunk(lambda x: x * 2 + 2, 20))
    refusing = worker("--once")
    assert refusing.wait(30) == 0
    row = Invocation.objects.get(pk=int(inv))
    assert (row.state, row.attempts) == ("queued", 1)  # refused, retry: back in the queue
    assert "pickled" in row.error
    worker("--allow-pickled")
    assert q.result(inv, timeout=30) == 42
    assert Invocation.objects.get(pk=int(inv)).attempts == 2


def test_a_queued_job_killed_from_the_cli_makes_result_raise(gpu, dp):
    inv = sdk_udfs.add.submit(1, 2, _dispatch=dp)
    services.invocation_kill(invocation_id=int(inv), reason="not needed")
    with pytest.raises(DispatchError, match="was killed"):
        dls.SyncQueue("gpu", dispatch=dp).result(inv, timeout=10)


def test_float_priorities_are_claimed_in_order(gpu, dp):
    q = dls.SyncQueue("gpu", dispatch=dp)
    ids = {p: q.submit(f"p{p}", priority=p) for p in (0, 5, -1, 5.5)}
    worker_dp = dls.HttpDispatch(dp._http.base_url, token=builders.token("daemon"))
    try:
        got = [worker_dp.claim("gpu", "test-host-01").id for _ in ids]
    finally:
        worker_dp.close()
    assert got == [ids[5.5], ids[5], ids[0], ids[-1]]


def test_roles_no_token_is_401_and_a_viewer_is_403(gpu, live_server):
    body = msgpack.packb({"queue": "gpu", "args_blob": b"\x01"}, use_bin_type=True)
    url = f"{live_server.url}/v1/namespaces/default/producer/submit"
    headers = {"content-type": "application/x-msgpack"}
    anonymous = httpx.post(url, content=body, headers=headers)
    assert anonymous.status_code == 401
    assert answer_of(anonymous)["error"]["code"] == "not_authenticated"
    viewer = httpx.post(
        url,
        content=body,
        headers={**headers, "authorization": f"Bearer {builders.token('viewer')}"},
    )
    assert viewer.status_code == 403
    poll = httpx.post(
        f"{live_server.url}/v1/daemon/poll",
        content=msgpack.packb({"worker_id": "w", "queue": "gpu"}),
        headers={**headers, "authorization": f"Bearer {builders.token('viewer')}"},
    )
    assert poll.status_code == 403


def test_another_namespace_is_404(gpu, live_server, operator_token):
    other = dls.HttpDispatch(live_server.url, token=operator_token, namespace="team a")
    try:
        with pytest.raises(DispatchError, match="404"):
            dls.SyncQueue("gpu", dispatch=other).submit({"x": 1})
    finally:
        other.close()


def test_a_draining_queue_refuses_the_submit(gpu, dp):
    queue_services.queue_transition(name="gpu", action="drain")
    with pytest.raises(DispatchError, match="409"):
        sdk_udfs.add.submit(1, 2, _dispatch=dp)
    assert not Invocation.objects.exists()


def test_a_blob_over_the_limit_is_413(gpu, dp):
    too_big = b"x" * 4096
    with (
        override_settings(LAKESHORE_SDK_MAX_BLOB_BYTES=2048),
        pytest.raises(DispatchError, match="413"),
    ):
        dls.SyncQueue("gpu", dispatch=dp).submit(too_big)


def test_an_sdk_worker_killed_during_a_job_has_it_rerun_after_the_lease_not_before(gpu, dp, worker):
    lease = 10  # seconds: far past the look at 2 s, whatever the machine's load
    with override_settings(LAKESHORE_HEARTBEAT_TIMEOUT=1, LAKESHORE_SDK_LEASE_SECONDS=lease):
        inv = sdk_udfs.nap.submit(30, _dispatch=dp)
        first = worker()
        wait_for(
            lambda: Invocation.objects.filter(pk=int(inv), state="running").exists(),
            what="the first worker to take the job",
        )
        os.killpg(first.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        time.sleep(2.0)  # past the heartbeat timeout, within the lease
        daemons.reap()
        row = Invocation.objects.get(pk=int(inv))
        assert (row.state, row.attempts) == ("running", 1)  # not rerun before the lease
        time.sleep(max(0.0, lease + 0.5 - (time.monotonic() - killed_at)))
        daemons.reap()
        row = Invocation.objects.get(pk=int(inv))
        assert (row.state, row.attempts) == ("queued", 1)  # handed back after it
        assert Daemon.objects.get(worker_id__isnull=False).state == "lost"


def test_an_idle_sdk_worker_that_stops_polling_is_lost_well_before_the_heartbeat_timeout(
    gpu, worker
):
    other = builders.daemon(queues=["gpu"])  # a daemon of ours, silent as long
    first = worker()
    wait_for(lambda: Daemon.objects.filter(worker_id__isnull=False).exists(), what="a poll")
    os.killpg(first.pid, signal.SIGKILL)  # no goodbye: the SDK has none
    silence = daemons.sdk_idle_silence()
    assert silence < 60  # the heartbeat timeout other daemons get
    seen = Daemon.objects.get(worker_id__isnull=False).last_heartbeat_at
    Daemon.objects.filter(pk=other.pk).update(last_heartbeat_at=seen)
    daemons.reap(now=seen + timedelta(seconds=silence - 1))
    assert Daemon.objects.get(worker_id__isnull=False).state == "idle"  # not yet
    daemons.reap(now=seen + timedelta(seconds=silence + 1))
    assert Daemon.objects.get(worker_id__isnull=False).state == "lost"
    other.refresh_from_db()
    assert other.state == "idle"  # the negative control: ours waits for its timeout
