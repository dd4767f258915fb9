"""`lakeshore jobs list --search`, `jobs retry --state … [--queue] [--search] [--since]
[--dry-run]` and `jobs bulk-cancel` with the same filters, as a user types them."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Invocation
from tests.jobs.test_search_bounds import fill
from tests.support import builders

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DISK = "Traceback (most recent call last):\n  File x\nOSError: disk full on /scratch\n"


def ended(state="failed", *, queue="train", error="", ago_s=60) -> Invocation:
    row = Invocation.objects.create(queue=queue, function="train.step", state=state, error=error)
    Invocation.objects.filter(pk=row.pk).update(
        finished_at=timezone.now() - timedelta(seconds=ago_s)
    )
    return row


@pytest.fixture
def failures():
    builders.queue(name="train")
    disk = [ended(error=DISK) for _ in range(3)]
    label = ended(error="KeyError: 'label'")
    return {"disk": disk, "label": label}


def test_list_search_finds_the_jobs_whose_error_says_so(sh, failures):
    shown = sh.json("lakeshore jobs list --search 'disk full' --json")
    assert sorted(int(j["id"]) for j in shown) == [r.pk for r in failures["disk"]]
    refused = sh("lakeshore jobs list --search ab", exit=1)
    assert "search" in refused.stderr and "3" in refused.stderr


def test_retry_every_failure_that_says_disk_dry_run_first(sh, failures):
    dry = sh("lakeshore jobs retry --state failed --search disk --since 1h --dry-run")
    assert dry.stdout == "would retry 3 job(s): state failed; search 'disk'; since 1h\n"
    assert not Invocation.objects.exclude(retry_of=None).exists()
    done = sh("lakeshore jobs retry --state failed --search disk --since 1h")
    assert done.stdout == "retried 3 job(s): state failed; search 'disk'; since 1h\n"
    retried = set(Invocation.objects.exclude(retry_of=None).values_list("retry_of", flat=True))
    assert retried == {r.pk for r in failures["disk"]}
    again = sh.json("lakeshore jobs retry --state failed --queue train --json")
    assert again == {
        "matched": 1,
        "retried": 1,
        "dry_run": False,
        "filter": "state failed; queue train",
    }


def test_retry_takes_an_id_or_filters(sh, failures):
    one = failures["label"].pk
    assert sh(f"lakeshore jobs retry {one}").stdout.startswith(f"job/{one} retried as job/")
    both = sh(f"lakeshore jobs retry {one} --state failed", exit=2)
    assert "give an ID or filters, not both: --state" in both.stderr
    neither = sh("lakeshore jobs retry", exit=2)
    assert "give an ID, or --state failed" in neither.stderr
    bad = sh("lakeshore jobs retry --state failed --since yesterday", exit=1)
    assert "since must be a span back from now (30m, 1h, 7d) or an ISO 8601 time" in bad.stderr


def test_bulk_cancel_takes_the_same_filters(sh):
    builders.queue(name="train")
    sh("lakeshore jobs submit train.prep --queue train")
    sh("lakeshore jobs submit train.step --queue train")
    dry = sh("lakeshore jobs bulk-cancel --queue train --search prep --since 1h --dry-run")
    assert dry.stdout == (
        "would cancel 1 queued invocation(s) in queue train holding 'prep' submitted since 1h\n"
    )
    sh("lakeshore jobs bulk-cancel --search prep")
    assert dict(Invocation.objects.values_list("function", "state")) == {
        "train.prep": "killed",
        "train.step": "queued",
    }


def test_a_search_too_broad_says_how_to_narrow_it(sh, settings):
    fill(20_000, retired=5_000)
    settings.LAKESHORE_SEARCH_TIMEOUT_SECONDS = 0.001  # the server runs in this process
    refused = sh("lakeshore jobs list --search legacy_sync", exit=1)
    assert "matches too many jobs to read within 0.001 s" in refused.stderr
    assert "narrow it with a queue, a state or a time (since, until)" in refused.stderr
    settings.LAKESHORE_SEARCH_TIMEOUT_SECONDS = 10  # the negative control: time enough
    assert len(sh.json("lakeshore jobs list --search legacy_sync --json")) == 50
