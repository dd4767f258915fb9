"""The console tour: every page in light and dark, at 1280 and 390 px, in Chromium.
At 390 px nothing may scroll sideways (no element wider than the viewport outside a box
that scrolls by itself). Screenshots go to LAKESHORE_SCREENSHOTS (`make screenshots`:
docs/tour, which the README links), else to the test's temporary folder."""

import contextlib
import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.services import token_create
from fleet import controller
from jobs import services as job_services
from jobs.models import Invocation
from queues import services
from queues.models import QueueEvent, QueueSample
from tests.support import builders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.browser]

TRACEBACK = """Traceback (most recent call last):
  File "/srv/train/loop.py", line 88, in step
    loss = model(batch).mean()
  File "/srv/train/model.py", line 41, in forward
    return self.head(self.body(x))
RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)"""

OVERFLOW_JS = """() => {
  const width = document.documentElement.clientWidth;
  const inScrollBox = (el) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      if (o === "auto" || o === "scroll" || o === "hidden" || o === "clip") return true;
    }
    return false;
  };
  const wide = [];
  for (const el of document.body.querySelectorAll("*")) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.height === 0) continue;
    if ((box.right > width + 1 || box.left < -1) && !inScrollBox(el)) {
      wide.push(`${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}.${el.className} ` +
                `(${Math.round(box.left)}..${Math.round(box.right)})`);
    }
  }
  return {scroll: document.documentElement.scrollWidth, width, wide: wide.slice(0, 8)};
}"""


@pytest.fixture
def world():
    """A small but busy system: queues with elasticity, jobs in every state, daemons,
    decisions and operator actions."""
    provider = builders.provider(name="sim")
    train = builders.queue(
        name="training-h100", kind="priority", provider="sim", description="H100 training runs",
        elasticity_spec={"kind": "pool_with_threshold", "min": 1, "max": 16, "threshold": 0.7},
    )  # fmt: skip
    builders.queue(name="eval", description="nightly evaluation")
    builders.queue(name="batch-embeddings-with-a-rather-long-name", kind="boltzmann")
    daemons = [
        builders.daemon(name=f"gpu-box-{i}", queues=["training-h100"], provider=provider)
        for i in range(3)
    ]
    for i in range(30):
        job_services.invocation_submit(
            function="train.loop.step", queue="training-h100", args=[i], priority=i % 4
        )
    builders.claim(daemon=daemons[0], limit=2)
    failed, _ = job_services.invocation_submit(
        function="train.loop.step", queue="eval", args=[{"lr": 3e-4, "batch": 512}],
        kwargs={"checkpoint": "s3://bucket/checkpoints/run-42/step-0009000.pt"},
    )  # fmt: skip
    now = timezone.now()
    Invocation.objects.filter(pk=failed.pk).update(
        state="failed", attempts=1, error=TRACEBACK, daemon=daemons[1],
        created_at=now - timedelta(seconds=140), started_at=now - timedelta(seconds=95),
        finished_at=now - timedelta(seconds=3),
    )  # fmt: skip
    for i in range(5):
        done, _ = job_services.invocation_submit(function="eval.run", queue="eval", args=[i])
        Invocation.objects.filter(pk=done.pk).update(
            state="succeeded", result={"accuracy": 0.91 + i / 100}, finished_at=now,
            started_at=now - timedelta(seconds=2 + i),
        )  # fmt: skip
    QueueEvent.objects.create(
        queue=train, at=now - timedelta(minutes=2), action="scale_up", daemons=3, busy=3,
        pending=28, utilization=1.0, desired=5, delta=2,
        reason="D=3 B=3 P=28 U=1.00: pool_with_threshold wants 5 → launching 2",
    )  # fmt: skip
    services.queue_transition(name="eval", action="pause")
    token_create(username="ci-bot", role="operator", name="nightly evaluation pipeline")
    token_create(username="robots", role="daemon", queues=["training-h100", "eval"])
    minute = now.replace(second=0, microsecond=0)
    QueueSample.objects.bulk_create(
        QueueSample(
            queue=train,
            at=minute - timedelta(minutes=m),
            pending=max(0, 60 - abs(30 - m) * 2),
            running=min(3, m // 10),
            daemons=1 + m // 20,
            busy=min(3, m // 10),
            desired=1 + m // 15,
            utilization=0.8,
        )  # fmt: skip
        for m in range(1, 60)
    )  # an hour of history behind the chart
    with contextlib.suppress(Exception):  # the tour goes on without a chart
        controller.tick()  # the samples behind the charts
    return {"queue": "training-h100", "failed": failed.pk}


def _pages(world) -> dict[str, str]:
    return {
        "queues": "/",
        "queue": f"/queues/{world['queue']}/",
        "queue-with-failures": "/queues/eval/",
        "queue-add": "/queues/add/",
        "queue-edit": f"/queues/{world['queue']}/edit/",
        "jobs": "/jobs/",
        "jobs-search-retry": "/jobs/?state=failed&search=cuda",
        "job": f"/jobs/{world['failed']}/",
        "daemons": "/daemons/",
        "events": "/events/",
        "tokens": "/tokens/",
        "not-found": "/queues/no-such-queue/",
    }


def test_every_page_fits_a_phone_and_is_shot_in_light_and_dark(page, live_server, world, tmp_path):
    folder = Path(os.environ.get("LAKESHORE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    get_user_model().objects.create_superuser("ops", "", "a-long-test-password")
    page.goto(f"{live_server.url}/login/")
    page.screenshot(path=str(folder / "login-light-1280.png"))
    page.fill("#id_username", "ops")
    page.fill("#id_password", "a-long-test-password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    problems = []
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for width, height in ((1280, 900), (390, 844)):
            page.set_viewport_size({"width": width, "height": height})
            for name, url in _pages(world).items():
                page.goto(f"{live_server.url}{url}")
                page.wait_for_load_state("networkidle")
                shot = folder / f"{name}-{scheme}-{width}.png"
                page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 0
                if width == 390:
                    fit = page.evaluate(OVERFLOW_JS)
                    if fit["scroll"] > fit["width"] or fit["wide"]:
                        problems.append((name, scheme, fit))
    assert not problems, problems


def test_dark_mode_follows_the_system_setting(page, live_server, world):
    get_user_model().objects.create_superuser("ops", "", "a-long-test-password")
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "a-long-test-password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    background = "getComputedStyle(document.body).backgroundColor"
    page.emulate_media(color_scheme="light")
    light = page.evaluate(background)
    page.emulate_media(color_scheme="dark")
    dark = page.evaluate(background)
    assert light == "rgb(247, 248, 250)" and dark == "rgb(15, 20, 26)"
