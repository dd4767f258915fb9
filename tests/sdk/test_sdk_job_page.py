"""An SDK job's function as the SDK sent it: the console's job page, the API's `function`
and `lakeshore jobs show` agree, for a @dls.udf call by reference, a pickled thunk and a
bare value, each submitted by the real SDK (dreamlake-lakeshore 0.5.0)."""

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from accounts.roles import grant
from jobs import sdk
from jobs.models import Invocation
from tests.support import builders

dls = pytest.importorskip("dreamlake.lakeshore")

from tests.support import sdk_udfs  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LAKESHORE = Path(sys.executable).parent / "lakeshore"


def page_function(client, pk: int) -> str:
    """The text of the Function row of the job's page."""
    page = client.get(f"/jobs/{pk}/").content.decode()
    [row] = re.findall(r"<dt>Function</dt><dd>(.*?)</dd>", page)
    return html.unescape(re.sub(r"<[^>]+>", "", row))


def cli_function(server: str, token: str, pk: int) -> str:
    env = {**os.environ, "LAKESHORE_URL": server, "LAKESHORE_TOKEN": token}
    env.pop("LAKESHORE_CLIENT_TOKEN", None)
    shown = subprocess.run(
        [LAKESHORE, "jobs", "show", str(pk)], env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    [line] = [line for line in shown.stdout.splitlines() if line.startswith("Function:")]
    return line.removeprefix("Function:").strip()


def test_the_function_is_shown_as_the_sdk_sent_it_everywhere(live_server, client, api):
    builders.queue(name="gpu")
    token = builders.token("operator")
    dp = dls.HttpDispatch(live_server.url, token=token, timeout=30)
    queue = dls.SyncQueue("gpu", dispatch=dp)
    try:
        ids = {
            "udf": sdk_udfs.add.submit(40, 2, _dispatch=dp),
            "thunk": queue.submit(dls.thunk(lambda x: x * 2 + 2, 20)),
            "value": queue.submit({"a": 1}),
        }
    finally:
        dp.close()
    viewer = get_user_model().objects.create_user("val")
    grant(viewer, "viewer")
    client.force_login(viewer)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    shown = {}
    for name, inv in ids.items():
        pk = int(inv)
        function = Invocation.objects.get(pk=pk).function
        assert api.get(f"/api/v1/jobs/{pk}/").json()["function"] == function
        assert cli_function(live_server.url, token, pk) == function
        shown[name] = page_function(client, pk)

    here = Path(__file__).resolve()
    assert shown["udf"] == (
        "tests.support.sdk_udfs.add (Python SDK: @dls.udf by reference, imported where it runs)"
    )
    assert re.fullmatch(
        rf"test_the_function_is_shown_as_the_sdk_sent_it_everywhere\.<locals>\.<lambda> "
        rf"\(Python SDK: pickled, defined at {re.escape(str(here))}:\d+\)",
        shown["thunk"],
    ), shown["thunk"]
    assert shown["value"] == "(value) (Python SDK: a bare value, SyncQueue.submit)"
    assert all("@dls.udf, thunk" not in text for text in shown.values())  # the old label


def test_a_blob_that_is_not_an_envelope_gives_no_function():
    """What the page falls back to: the plain note, never an error."""
    builders.queue(name="gpu")
    inv, _ = sdk.submit({"queue": "gpu", "args_blob": b"\x93\x01\x02\x03"})  # a bare value
    Invocation.objects.filter(pk=inv.pk).update(wire="envelope")  # as if it claimed to be one
    assert sdk.shipped_function(inv.pk) is None
    assert sdk.function_note(Invocation.objects.get(pk=inv.pk)) == "Python SDK"
