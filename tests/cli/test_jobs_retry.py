"""`lakeshore jobs retry ID`: the installed command against a live server."""

import json

import pytest

from jobs import services
from jobs.models import Invocation
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_jobs_retry_queues_a_new_invocation_and_show_links_both(sh):
    builders.queue(name="gpu")
    old, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="gpu")
    Invocation.objects.filter(pk=old.pk).update(state="failed", error="ValueError: no")
    out = sh(f"lakeshore jobs retry {old.pk}").stdout
    new = Invocation.objects.get(retry_of=old)
    assert out.strip() == f"job/{old.pk} retried as job/{new.pk}"
    assert new.state == "queued"
    shown = sh(f"lakeshore jobs show {old.pk}").stdout
    assert [line.split() for line in shown.splitlines() if line.startswith("Retried as")] == [
        ["Retried", "as:", f"job/{new.pk}"]
    ]
    retry = sh(f"lakeshore jobs show {new.pk}").stdout
    assert [line.split() for line in retry.splitlines() if line.startswith("Retry of")] == [
        ["Retry", "of:", f"job/{old.pk}"]
    ]
    as_json = json.loads(sh(f"lakeshore jobs show {new.pk} --json").stdout)
    assert as_json["retry_of"] == str(old.pk)


def test_jobs_retry_of_a_job_that_succeeded_says_why(sh):
    builders.queue(name="gpu")
    done, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="gpu")
    Invocation.objects.filter(pk=done.pk).update(state="succeeded")
    result = sh(f"lakeshore jobs retry {done.pk}", exit=1)
    assert result.stderr.startswith("error: ")
    assert "only a failed, timed-out or killed invocation can be retried" in result.stderr
    twice, _ = services.invocation_submit(function="lakeshore.functions.echo", queue="gpu")
    Invocation.objects.filter(pk=twice.pk).update(state="killed")
    sh(f"lakeshore jobs retry {twice.pk}")
    again = sh(f"lakeshore jobs retry {twice.pk}", exit=1)
    assert "was already retried as" in again.stderr
