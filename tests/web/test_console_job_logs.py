"""A job's output on its console page (jobs/log_views.py): the last lines with their
stream, the attempt chosen, the live tail's next lines, the download, and a failed
job's last lines beside its error. Lines shipped by a registered daemon."""

import time

import pytest
from django.contrib.auth import get_user_model

from accounts.roles import grant
from jobs.models import Invocation
from tests.support.job_logs import lines, running_job, ship

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def viewer(client):
    user = get_user_model().objects.create_user("reader", password="pw-x-12345")
    grant(user, "viewer")
    client.force_login(user)
    return client


def complete(daemon, me, job, state="failed", error="ValueError: nope"):
    answer = daemon.post(
        f"/api/v1/daemons/{me}/complete/",
        {"invocation": job, "attempt": 1, "state": state, "error": error, "retry": False},
        format="json",
    )
    assert answer.status_code == 200, answer.content


def test_a_viewer_sees_the_output_with_its_streams_and_a_live_tail(viewer):
    job, me, daemon = running_job()
    ship(daemon, me, job, [["o", time.time(), "epoch 1"], ["e", time.time(), "warning: <x>"]])
    page = viewer.get(f"/jobs/{job}/").content.decode()
    assert '<span class="line out">epoch 1</span>' in page
    assert '<span class="line err">warning: &lt;x&gt;</span>' in page  # escaped
    assert f'href="/jobs/{job}/log.txt?attempt=1"' in page
    assert f'hx-get="/jobs/{job}/log/?attempt=1&amp;offset=2"' in page  # the next lines
    more = viewer.get(f"/jobs/{job}/log/", {"attempt": 1, "offset": 2}).content.decode()
    assert "line" not in more.replace("log-more", "")  # nothing new yet, and it polls on
    assert 'hx-trigger="every 1s"' in more
    ship(daemon, me, job, lines(2), seq=1)
    more = viewer.get(f"/jobs/{job}/log/", {"attempt": 1, "offset": 2}).content.decode()
    assert '<span class="line out">line 0</span>' in more
    assert "offset=4" in more


def test_a_finished_attempt_stops_polling_and_a_failure_shows_its_last_lines(viewer):
    job, me, daemon = running_job()
    ship(daemon, me, job, lines(30))
    complete(daemon, me, job)
    page = viewer.get(f"/jobs/{job}/").content.decode()
    assert 'hx-trigger="every 1s"' not in page
    beside = page.split("The last lines it printed", 1)[1].split("</pre>", 1)[0]
    assert "line 29" in beside and "line 10" in beside and "line 9<" not in beside  # 20 lines
    assert "ValueError: nope" in page


def test_the_download_is_the_whole_log_as_text(viewer):
    job, me, daemon = running_job()
    for seq in range(3):
        ship(daemon, me, job, lines(700, start=seq * 700), seq=seq)
    answer = viewer.get(f"/jobs/{job}/log.txt")
    assert answer["Content-Type"] == "text/plain; charset=utf-8"
    assert answer["Content-Disposition"] == f'attachment; filename="job-{job}-attempt-1.log"'
    text = b"".join(answer.streaming_content).decode()
    assert text.splitlines() == [f"line {i}" for i in range(2100)]
    page = viewer.get(f"/jobs/{job}/").content.decode()
    assert "The last 1000 lines; the earlier ones are in the download." in page
    assert ">line 1100<" in page and ">line 2099<" in page  # the last 1,000
    assert ">line 1099<" not in page


def test_each_attempt_has_its_own_log(viewer):
    job, me, daemon = running_job()
    ship(daemon, me, job, [["o", time.time(), "first try"]])
    Invocation.objects.filter(pk=job).update(max_attempts=2)
    daemon.post(
        f"/api/v1/daemons/{me}/complete/",
        {"invocation": job, "attempt": 1, "state": "failed", "error": "x"},
        format="json",
    )
    Invocation.objects.filter(pk=job).update(scheduled_at=None)  # no back-off wait
    claimed = daemon.post(f"/api/v1/daemons/{me}/claim/", {"limit": 1}, format="json").json()
    assert [c["attempts"] for c in claimed] == [2]
    ship(daemon, me, job, [["o", time.time(), "second try"]], attempt=2)
    latest = viewer.get(f"/jobs/{job}/").content.decode()
    assert "second try" in latest and "first try" not in latest
    assert '<strong aria-current="page">2</strong>' in latest
    first = viewer.get(f"/jobs/{job}/", {"attempt": 1}).content.decode()
    assert "first try" in first and "second try" not in first
    assert viewer.get(f"/jobs/{job}/", {"attempt": 3}).status_code == 404
    assert viewer.get(f"/jobs/{job}/", {"attempt": "x"}).status_code == 404
    assert viewer.get(f"/jobs/{job}/log/", {"offset": "-1"}).status_code == 404


def test_a_job_that_printed_nothing_says_so_without_an_empty_box(viewer):
    job, me, daemon = running_job()
    running = viewer.get(f"/jobs/{job}/").content.decode()
    assert 'id="job-log"' in running  # while it runs, the box waits for its lines
    complete(daemon, me, job, state="succeeded", error="")
    page = viewer.get(f"/jobs/{job}/").content.decode()
    output = page.split('id="job-output"', 1)[1].split("</section>", 1)[0]
    assert "It printed nothing." in output and 'id="job-log"' not in output
