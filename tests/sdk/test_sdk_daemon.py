"""This project's daemon (`lakeshore daemon run`) runs the Python SDK's invocations
through the SDK's exec contract (lakeshore/sdk_job.py), next to JSON ones."""

import signal
import sys
from pathlib import Path

import pytest

from fleet.models import Daemon
from jobs import logs, services
from jobs.models import Invocation
from tests.support import builders
from tests.support.waiting import wait_for

dls = pytest.importorskip("dreamlake.lakeshore")
from dreamlake.lakeshore.dispatch import DispatchError  # noqa: E402

from tests.support import sdk_udfs  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LAKESHORE = str(Path(sys.executable).parent / "lakeshore")


@pytest.fixture
def gpu():
    return builders.queue(name="gpu", kind="priority")


@pytest.fixture
def dp(live_server):
    dispatch = dls.HttpDispatch(live_server.url, token=builders.token("operator"))
    yield dispatch
    dispatch.close()


@pytest.fixture
def daemon(live_server, tmp_path, processes):
    """Start `lakeshore daemon run` in the project directory (where
    tests.support.sdk_udfs imports from); killed at the end if still running."""

    def start(*flags, allowed="tests.support.sdk_udfs", pythonpath=None):
        env = {
            "LAKESHORE_URL": live_server.url,
            "LAKESHORE_TOKEN": builders.token("daemon"),
            "LAKESHORE_ALLOWED_MODULES": allowed,
            "XDG_CONFIG_HOME": str(tmp_path),
            **({"PYTHONPATH": pythonpath} if pythonpath else {}),
        }
        command = [LAKESHORE, "daemon", "run", "--queues", "gpu", "--heartbeat", "1", *flags]
        return processes(command, name="daemon", env=env)

    return start


def test_lakeshore_daemon_run_runs_an_sdk_call_and_a_json_job_side_by_side(gpu, dp, daemon):
    inv = sdk_udfs.add.submit(40, 2, _dispatch=dp)
    echo, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="gpu")
    daemon()
    assert dls.SyncQueue("gpu", dispatch=dp).result(inv, timeout=60) == {
        "sum": 42,
        "pair": (40, 2),
    }
    row = Invocation.objects.get(pk=int(inv))
    ours = Daemon.objects.get(pk=row.daemon_id)
    assert ours.worker_id is None  # this project's daemon, not the SDK's worker
    # The JSON job, queued behind the SDK call, is claimed after it: by the exchange that
    # reports the call, or the claim after it, a moment after the call's result shows.
    wait_for(
        lambda: Invocation.objects.get(pk=echo.pk).state == "succeeded",
        what="the JSON job next to the SDK call succeeded",
    )


def test_its_failure_reaches_result_and_is_retried_like_any_other(gpu, dp, daemon):
    inv = sdk_udfs.boom.submit(0, _dispatch=dp)
    daemon()
    with pytest.raises(DispatchError, match="ZeroDivisionError: division by zero"):
        dls.SyncQueue("gpu", dispatch=dp).result(inv, timeout=60)
    assert Invocation.objects.get(pk=int(inv)).attempts == 3  # LAKESHORE_SDK_MAX_ATTEMPTS


def test_a_pickled_thunk_is_refused_for_good_without_allow_pickled_then_runs_with_it(
    gpu, dp, daemon
):
    q = dls.SyncQueue("gpu", dispatch=dp)
    refused = q.submit(dls.thunk(lambda x: x * 2 + 2, 20))
    strict = daemon()
    with pytest.raises(DispatchError, match="refuses pickled functions"):
        q.result(refused, timeout=60)
    assert Invocation.objects.get(pk=int(refused)).attempts == 1  # final: no retry
    strict.send_signal(signal.SIGTERM)
    assert strict.wait(30) == 0

    accepted = q.submit(dls.thunk(lambda x: x * 2 + 2, 20))
    daemon("--allow-pickled")
    assert q.result(accepted, timeout=60) == 42


def test_a_module_outside_the_allowed_ones_is_refused(gpu, dp, daemon):
    inv = sdk_udfs.add.submit(1, 2, _dispatch=dp)
    daemon(allowed="")
    with pytest.raises(DispatchError, match="not in an allowed module"):
        dls.SyncQueue("gpu", dispatch=dp).result(inv, timeout=60)


def test_without_the_sdk_where_the_daemon_runs_it_says_what_to_install(gpu, dp, daemon, tmp_path):
    shadow = tmp_path / "shadow"
    (shadow / "dreamlake").mkdir(parents=True)
    (shadow / "dreamlake" / "__init__.py").write_text("")  # a dreamlake without lakeshore
    inv = sdk_udfs.add.submit(1, 2, _dispatch=dp)
    daemon(pythonpath=str(shadow))
    with pytest.raises(DispatchError, match="pip install dreamlake-lakeshore"):
        dls.SyncQueue("gpu", dispatch=dp).result(inv, timeout=60)


def test_what_an_sdk_call_prints_is_in_its_log(gpu, dp, daemon):
    inv = sdk_udfs.chatty.submit(3, _dispatch=dp)
    daemon()
    assert dls.SyncQueue("gpu", dispatch=dp).result(inv, timeout=60) == 3
    page = logs.read(int(inv))
    assert [line["text"] for line in page["lines"]] == [f"sdk line {i}" for i in range(3)]
    assert page["complete"]
