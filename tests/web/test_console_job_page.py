"""/jobs/<id>/: everything about one job, with Kill and Retry for operators."""

import html
import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.roles import grant
from fleet.models import DaemonCommand
from jobs import services
from jobs.models import Invocation, InvocationState, JobLog, LogChunk
from tests.support import builders

pytestmark = pytest.mark.django_db

TRACEBACK = """Traceback (most recent call last):
  File "/srv/train.py", line 12, in step
    loss = model(batch)
ValueError: batch 7 has NaN loss"""


def _login(client, role: str):
    user = get_user_model().objects.create_user(f"u-{role}", password="pw-x-12345")
    grant(user, role)
    client.force_login(user)
    return client


@pytest.fixture
def viewer(client):
    return _login(client, "viewer")


@pytest.fixture
def operator(client):
    return _login(client, "operator")


@pytest.fixture
def failed():
    builders.queue(name="train")
    daemon = builders.daemon(queues=["train"], name="gpu-box-1")
    now = timezone.now()
    inv, _ = services.invocation_submit(
        function="lakeshore.functions.echo", queue="train", args=[1, "two"],
        kwargs={"lr": 0.1}, priority=5, key="run-7", max_attempts=2, timeout_s=60,
    )  # fmt: skip
    Invocation.objects.filter(pk=inv.pk).update(
        state="failed", attempts=2, daemon=daemon, error=TRACEBACK,
        created_at=now - timedelta(seconds=100), started_at=now - timedelta(seconds=70),
        finished_at=now - timedelta(seconds=10),
    )  # fmt: skip
    inv.refresh_from_db()
    return inv


def test_a_failed_job_shows_everything_and_the_whole_traceback(viewer, failed):
    body = html.unescape(viewer.get(f"/jobs/{failed.pk}/").content.decode())
    for text in (
        f"Job {failed.pk}", "lakeshore.functions.echo", 'href="/queues/train/"', "failed",
        "run-7", "2/2", "60 s", f'href="/daemons/?id={failed.daemon_id}"', "gpu-box-1",
        "30 s",  # waited
        "1 min",  # ran
        '"two"', '"lr": 0.1',
        'File "/srv/train.py", line 12, in step', "ValueError: batch 7 has NaN loss",
    ):  # fmt: skip
        assert text in body, text
    assert "Retry" not in body and "Kill" not in body  # a viewer gets no buttons


def test_a_queued_job_shows_its_position_and_an_eta_from_the_queue_s_recent_pace(viewer):
    builders.queue(name="train")
    now = timezone.now()
    done = Invocation.objects.bulk_create(
        [Invocation(queue="train", function="a.b", state="succeeded") for _ in range(20)]
    )
    Invocation.objects.filter(pk__in=[d.pk for d in done]).update(finished_at=now)
    ahead = [services.invocation_submit(function="a.b", queue="train")[0] for _ in range(3)]
    mine, _ = services.invocation_submit(function="a.b", queue="train")
    body = viewer.get(f"/jobs/{mine.pk}/").content.decode()
    assert "3 ahead" in body
    # 20 finished in 10 minutes: 2 a minute; 4 to go (3 ahead and itself): about 2 min
    assert "about 2 min" in body and "2.0 a minute" in body
    assert len(ahead) == 3
    Invocation.objects.filter(state="succeeded").update(finished_at=now - timedelta(hours=1))
    assert "unknown" in viewer.get(f"/jobs/{mine.pk}/").content.decode()


def test_an_unknown_job_is_a_404_that_says_so(viewer):
    response = viewer.get("/jobs/987654/")
    assert response.status_code == 404
    assert "Invocation '987654' does not exist." in html.unescape(response.content.decode())


def test_the_job_page_costs_a_fixed_number_of_queries(viewer, failed):
    def count(pk):
        with CaptureQueriesContext(connection) as ctx:
            assert viewer.get(f"/jobs/{pk}/").status_code == 200
        return len(ctx)

    queued, _ = services.invocation_submit(function="a.b", queue="train")
    assert count(failed.pk) <= 9  # with its log's totals
    assert count(queued.pk) <= 12  # plus its position, the queue's pace and who serves it
    # a log adds one read of its lines, however many lines and chunks it holds
    log = JobLog.objects.create(invocation=failed, attempt=failed.attempts)
    for seq in range(30):
        LogChunk.objects.create(
            invocation=failed,
            attempt=failed.attempts,
            first_line=seq * 50,
            count=50,
            bytes=50 * 7,
            streams="o" * 50,
            times=[1.0] * 50,
            text="\n".join(f"line {seq * 50 + i}" for i in range(50)),
        )
    log.lines, log.head_bytes = 1500, 1500 * 7
    log.save()
    assert count(failed.pk) <= 10


def test_an_operator_retries_a_failed_job_and_lands_on_the_new_one(operator, failed):
    page = operator.get(f"/jobs/{failed.pk}/").content.decode()
    assert f'aria-label="Retry job {failed.pk}"' in page and "Kill job" not in page
    response = operator.post(f"/jobs/{failed.pk}/retry/", follow=True)
    new = Invocation.objects.get(retry_of=failed)
    assert response.redirect_chain[-1][0] == f"/jobs/{new.pk}/"
    body = response.content.decode()
    assert f"Job {failed.pk} retried as job {new.pk}." in body and 'aria-live="polite"' in body
    assert f'href="/jobs/{failed.pk}/"' in body  # "Retry of"
    again = operator.post(f"/jobs/{failed.pk}/retry/", follow=True).content.decode()
    assert f"was already retried as {new.pk}" in again
    assert Invocation.objects.filter(retry_of=failed).count() == 1


def test_an_htmx_action_answers_with_a_full_page_load(operator, failed):
    response = operator.post(f"/jobs/{failed.pk}/retry/", headers={"HX-Request": "true"})
    new = Invocation.objects.get(retry_of=failed)
    assert response.status_code == 204 and response["HX-Redirect"] == f"/jobs/{new.pk}/"


def test_an_operator_kills_a_queued_job_and_a_refusal_is_said(operator):
    builders.queue(name="train")
    queued, _ = services.invocation_submit(function="a.b", queue="train")
    page = operator.get(f"/jobs/{queued.pk}/").content.decode()
    assert f'aria-label="Kill job {queued.pk}"' in page and "hx-confirm" in page
    body = operator.post(f"/jobs/{queued.pk}/kill/", follow=True).content.decode()
    assert f"Job {queued.pk} killed." in body
    queued.refresh_from_db()
    assert queued.state == "killed"
    assert "u-operator (via console): killed a.b: killed from the console" in body  # timeline
    body = operator.post(f"/jobs/{queued.pk}/kill/", follow=True).content.decode()
    assert f"Job {queued.pk} was not killed: Invocation {queued.pk} already finished" in body


def test_a_viewer_cannot_act(viewer, failed):
    assert viewer.post(f"/jobs/{failed.pk}/retry/").status_code == 403
    assert not Invocation.objects.filter(retry_of=failed).exists()


def test_the_jobs_list_links_each_job_and_shows_a_failure_s_last_line(viewer, failed):
    body = viewer.get("/jobs/").content.decode()
    assert f'href="/jobs/{failed.pk}/"' in body
    assert "ValueError: batch 7 has NaN loss" in body and "in step" not in body


def test_a_refresh_after_the_session_ended_loads_the_login_page_whole(client):
    response = client.get(
        "/jobs/5/",
        headers={
            "HX-Request": "true",
            "HX-Target": "job-summary",
            "HX-Current-URL": "http://testserver/jobs/5/?x=1",
        },
    )
    assert response.status_code == 204
    assert response["HX-Redirect"] == "/login/?next=/jobs/5/%3Fx%3D1"


def test_staff_cross_between_the_job_page_and_django_admin(client, failed):
    staff = get_user_model().objects.create_superuser("root", "", "pw-x-12345")
    client.force_login(staff)
    page = client.get(f"/jobs/{failed.pk}/").content.decode()
    assert f'href="/admin/jobs/invocation/{failed.pk}/change/"' in page
    admin = client.get(f"/admin/jobs/invocation/{failed.pk}/change/").content.decode()
    assert "View on site" in admin


def test_others_get_no_admin_link(viewer, failed):
    assert "/admin/jobs/invocation/" not in viewer.get(f"/jobs/{failed.pk}/").content.decode()


def test_a_busy_queue_s_pace_is_read_from_its_newest_finishes_only(viewer, monkeypatch):
    monkeypatch.setattr(services, "ETA_SAMPLE", 5)  # the whole window would say 2 a minute
    builders.queue(name="train")
    now = timezone.now()
    done = Invocation.objects.bulk_create(
        [Invocation(queue="train", function="a.b", state="succeeded") for _ in range(20)]
    )
    for i, row in enumerate(done, start=1):  # one every 6 s: 10 a minute
        Invocation.objects.filter(pk=row.pk).update(finished_at=now - timedelta(seconds=6 * i))
    mine, _ = services.invocation_submit(function="a.b", queue="train")
    with CaptureQueriesContext(connection) as ctx:
        body = viewer.get(f"/jobs/{mine.pk}/").content.decode()
    pace = float(re.search(r"the queue finished ([\d.]+) a minute", body).group(1))
    assert 9.0 < pace <= 10.0  # from the newest 5 (5 in 30 s and a moment), not all 20
    assert not any("COUNT(" in q["sql"] and "finished_at" in q["sql"] for q in ctx.captured_queries)


def _running_on_a_daemon():
    builders.queue(name="q")
    daemon = builders.daemon(queues=["q"])
    inv, _ = services.invocation_submit(function="a.b", queue="q")
    assert [i.pk for i in builders.claim(daemon=daemon)] == [inv.pk]
    return daemon, inv


def test_an_operator_stops_a_running_job_on_its_daemon(operator):
    daemon, inv = _running_on_a_daemon()
    page = operator.get(f"/jobs/{inv.pk}/").content.decode()
    assert "Stop on daemon" in page and f"Stop job {inv.pk} on daemon {daemon.pk}?" in page
    assert f'id="kill-{inv.pk}"' not in page  # Kill is for queued jobs

    body = operator.post(f"/daemons/{daemon.pk}/jobs/{inv.pk}/stop/", follow=True).content.decode()
    assert f"Job {inv.pk} killed; daemon {daemon.pk} stops its processes" in body
    inv.refresh_from_db()
    assert inv.state == "killed"
    assert inv.reason == f"stopped on daemon {daemon.pk} by u-operator (daemon exec kill)"
    assert DaemonCommand.objects.get().requested_by == "u-operator (console)"
    assert "Stop on daemon" not in body  # it no longer runs

    again = operator.post(f"/daemons/{daemon.pk}/jobs/{inv.pk}/stop/", follow=True).content.decode()
    assert f"Job {inv.pk} was not stopped: Invocation {inv.pk} is not running (killed)" in again
    assert DaemonCommand.objects.count() == 1


def test_a_stop_sent_to_another_daemon_is_refused_and_says_where_the_job_runs(operator):
    daemon, inv = _running_on_a_daemon()
    other = builders.daemon(queues=["q"], name="other")

    body = operator.post(f"/daemons/{other.pk}/jobs/{inv.pk}/stop/", follow=True).content.decode()
    assert (
        f"Job {inv.pk} was not stopped: Invocation {inv.pk} runs on daemon {daemon.pk}, "
        f"not {other.pk}"
    ) in body
    assert Invocation.objects.get(pk=inv.pk).state == "running"
    assert not DaemonCommand.objects.exists()


def test_a_viewer_sees_no_stop_button_and_cannot_stop(viewer):
    daemon, inv = _running_on_a_daemon()
    assert "Stop on daemon" not in viewer.get(f"/jobs/{inv.pk}/").content.decode()
    assert viewer.post(f"/daemons/{daemon.pk}/jobs/{inv.pk}/stop/").status_code == 403
    assert Invocation.objects.get(pk=inv.pk).state == "running"


@pytest.mark.parametrize("state", InvocationState.values)
def test_the_page_offers_what_the_job_s_state_allows(operator, state):
    """The template asks the model (can_kill, can_stop, can_retry, is_active,
    is_succeeded): each button, the refresh and the result's wording, state by state."""
    inv = builders.invocation(state)
    page = operator.get(f"/jobs/{inv.pk}/").content.decode()
    assert (f'id="kill-{inv.pk}"' in page) == inv.can_kill == (state == "queued")
    assert (f'id="stop-{inv.pk}"' in page) == inv.can_stop == (state == "running")
    retry = f'id="retry-{inv.pk}"' in page
    assert retry == inv.can_retry == (state in ("failed", "killed", "timeout"))
    refreshes = '<section id="job-summary" class="summary" hx-get=' in page
    assert refreshes == inv.is_active == (state in ("queued", "running"))
    said = {"queued": "No result yet.", "running": "No result yet.", "succeeded": "None."}
    assert f'<p class="empty">{said.get(state, "No result.")}</p>' in page


def test_a_queued_job_nothing_serves_says_how_to_start_a_daemon(viewer):
    builders.queue(name="gpu")
    job, _ = services.invocation_submit(function="a.b", queue="gpu")
    body = html.unescape(viewer.get(f"/jobs/{job.pk}/").content.decode())
    start = "start one with <code>lakeshore daemon run"
    assert f"no live daemon serves queue gpu; {start} --queues gpu</code>" in body
    assert 'unknown <span class="hint">(no live daemon serves this queue)' in body
    default, _ = services.invocation_submit(function="a.b")
    body = html.unescape(viewer.get(f"/jobs/{default.pk}/").content.decode())
    assert f"no live daemon serves the default queue; {start}</code>" in body


def test_a_queued_job_a_live_daemon_serves_says_nothing_of_starting_one(viewer):
    builders.queue(name="gpu")
    builders.daemon(queues=["gpu"], state="busy")
    builders.daemon(queues=[], state="idle")
    for queue in ("gpu", ""):
        job, _ = services.invocation_submit(function="a.b", queue=queue)
        body = viewer.get(f"/jobs/{job.pk}/").content.decode()
        assert 'id="job-unserved"' not in body and "lakeshore daemon run" not in body
        assert "unknown" in body  # nothing finished lately: no pace to go by


def test_a_queued_job_of_an_elastic_queue_waits_for_its_provider(viewer):
    builders.provider(name="sim")
    builders.queue(name="elastic", provider="sim", elasticity_spec={"kind": "fully_elastic"})
    job, _ = services.invocation_submit(function="a.b", queue="elastic")
    body = viewer.get(f"/jobs/{job.pk}/").content.decode()
    assert "its provider starts one at the controller" in body
    assert "lakeshore daemon run" not in body
