"""Issue 29, item 12: a provider's daemons get an allow-listed environment, never the
server's. A secret in the server's environment (a cloud key) was in a local daemon's
/proc/PID/environ, which its jobs can read; on Slurm, `--export=ALL` and `--chdir`
into var/ handed jobs the server's environment and directory.

The local provider runs a real `lakeshore daemon run` against the live server; the
Slurm provider's `sbatch` is a recording stand-in on PATH (the boundary: what the
server asks of Slurm), as no cluster runs here (tests/fleet/test_slurm_provider.py runs
a real one)."""

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from fleet.driver_base import DRIVERS, server_free_environ
from fleet.models import Daemon
from queues.models import QueueEvent
from tests.support import builders
from tests.support.assertions import assert_error
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.security]

SECRET = "AWS_SECRET_ACCESS_KEY"


@pytest.fixture
def server_env(monkeypatch):
    """The server's environment holds a cloud secret, a database password and a name
    a provider's config will allow."""
    monkeypatch.setenv(SECRET, "server-only-secret")
    monkeypatch.setenv("PGPASSWORD", "db-password")
    monkeypatch.setenv("HF_HOME", "/scratch/hf")
    monkeypatch.setenv("LANG", "C.UTF-8")


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


@pytest.mark.slow
def test_a_local_daemon_gets_no_server_secret_only_what_its_config_names(
    live_server, settings, tmp_path, server_env
):
    settings.LAKESHORE_PUBLIC_URL = live_server.url
    settings.VAR_DIR = tmp_path
    builders.provider(name="here", kind="local", config={"environment": ["HF_HOME"]})
    queue = builders.queue(name="env", provider="here", elasticity_spec={"kind": "fixed", "min": 1})
    try:
        builders.tick_queue(queue.pk)
        daemon = Daemon.objects.get()
        wait_for(lambda: Daemon.objects.get(pk=daemon.pk).state == "idle", what="the daemon")
        pid = int(Daemon.objects.get(pk=daemon.pk).external_id.removeprefix("pid:"))
        seen = _environ(pid)
    finally:
        for process in DRIVERS["local"].processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
        DRIVERS["local"].processes.clear()

    assert SECRET not in seen and "PGPASSWORD" not in seen  # the attack: absent
    assert server_free_environ()[SECRET] == "server-only-secret"  # the old rule passed it
    assert seen["HF_HOME"] == "/scratch/hf"  # control: the provider's config names it
    assert seen["LANG"] == "C.UTF-8" and seen["PATH"] == os.environ["PATH"]  # its needs
    assert seen["HOME"] == str(tmp_path / "homes" / daemon.name)
    assert seen["LAKESHORE_URL"] == live_server.url and seen["LAKESHORE_TOKEN"].startswith("lsk_")
    assert set(seen) <= {
        *("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "PYTHONPATH"),
        *("VIRTUAL_ENV", "HF_HOME", "LAKESHORE_URL", "LAKESHORE_TOKEN"),
        *(name for name in seen if name.startswith("LC_")),
    }, sorted(seen)


FAKE_SBATCH = """\
    #!{python}
    import json, os, sys
    with open({record!r}, "a") as out:
        seen = {{"argv": sys.argv[1:], "env": dict(os.environ), "script": sys.stdin.read()}}
        json.dump(seen, out)
        out.write("\\n")
    if os.environ.get("FAKE_SBATCH_REFUSES"):
        sys.exit("sbatch: error: invalid partition specified: nope")
    print("4242")
"""


@pytest.fixture
def sbatch(tmp_path, monkeypatch):
    """A stand-in `sbatch` first on PATH: it records its argv, environment and script,
    and answers a job id."""
    bin_dir, record = tmp_path / "bin", tmp_path / "sbatch.jsonl"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text(textwrap.dedent(FAKE_SBATCH).format(python=sys.executable, record=str(record)))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def calls() -> list[dict]:
        text = record.read_text() if record.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    return calls


def test_a_slurm_job_exports_only_the_daemons_names_and_starts_in_its_home(
    settings, tmp_path, server_env, sbatch
):
    settings.VAR_DIR = tmp_path / "var"
    builders.provider(
        name="hpc", kind="slurm", config={"partition": "debug", "environment": ["HF_HOME"]}
    )
    queue = builders.queue(
        name="train", provider="hpc", elasticity_spec={"kind": "fixed", "min": 1}
    )

    builders.tick_queue(queue.pk)

    [call] = sbatch()
    daemon = Daemon.objects.get()
    options = dict(arg.split("=", 1) for arg in call["argv"] if "=" in arg)
    exported = options["--export"].split(",")
    home = tmp_path / "var" / "homes" / daemon.name
    assert "ALL" not in exported and SECRET not in exported and "PGPASSWORD" not in exported
    assert "HF_HOME" in exported  # control: the provider's config names it
    assert {"PATH", "HOME", "LANG", "LAKESHORE_URL", "LAKESHORE_TOKEN"} <= set(exported)
    assert all(name in call["env"] for name in exported)  # sbatch takes each value from its env
    assert call["env"]["HOME"] == str(home) and options["--chdir"] == str(home)
    assert home.is_dir() and home.stat().st_mode & 0o777 == 0o700
    assert call["env"]["LAKESHORE_TOKEN"] not in call["script"] + " ".join(call["argv"])
    assert Daemon.objects.get().external_id == "4242"


def test_a_refused_sbatch_leaves_no_home_behind(settings, tmp_path, sbatch, monkeypatch):
    settings.VAR_DIR = tmp_path / "var"
    monkeypatch.setenv("FAKE_SBATCH_REFUSES", "1")
    builders.provider(name="hpc", kind="slurm", config={"partition": "nope"})
    queue = builders.queue(
        name="train", provider="hpc", elasticity_spec={"kind": "fixed", "min": 2}
    )

    builders.tick_queue(queue.pk)

    assert len(sbatch()) == 1  # the first refusal fails the rest of the launch
    assert "invalid partition specified" in QueueEvent.objects.get(action="launch_failed").reason
    assert list((tmp_path / "var" / "homes").iterdir()) == []


@pytest.fixture
def operator_client():
    client = APIClient()
    client.credentials(**builders.auth(builders.token("operator")))
    return client


@pytest.mark.parametrize(
    "names, says",
    [
        (["DATABASE_URL"], "the server's own setting"),
        (["LAKESHORE_TOKEN"], "the server's own setting"),
        (["PGPASSWORD"], "the server's own setting"),
        (["BAD NAME"], "not an environment variable name"),
        ("HF_HOME", "must be a list"),
    ],
)
@pytest.mark.parametrize("kind", ["local", "slurm"])
def test_a_provider_may_not_name_the_servers_own_settings(operator_client, kind, names, says):
    answer = operator_client.post(
        "/api/v1/providers/",
        {"name": "p", "kind": kind, "config": {"environment": names}},
        format="json",
    )

    assert_error(answer, 400, "invalid", field="config.environment", says=says)
