"""Issue 17, "give jobs their own files": a local provider's jobs get a HOME of their
own under var/ (0700), not the server's, where `make run` keeps an operator's token in
~/.config/lakeshore/auth.yml; the secret key and auth.yml are 0600 from the moment they
exist; `run_as: USER` runs the daemons and their jobs as that user (tested as root with
a user this module creates). Real daemons against the live server, as in
tests/fleet/test_local_provider.py."""

import importlib.util
import os
import pathlib
import pwd
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from fleet import driver_base, drivers
from fleet.driver_base import DRIVERS
from fleet.models import Daemon
from fleet.provider_configs import config_errors
from jobs import services
from jobs.models import Invocation
from lakeshore import config as cli_config
from lakeshore import private
from lakeshore_admin import settings as server_settings
from tests.support import builders
from tests.support.assertions import assert_error
from tests.support.waiting import wait_for

pytestmark = pytest.mark.security

ROOT = Path(__file__).resolve().parents[2]
USER = "lakeshore-test-job"

JOBFILES = '''
import os


def report(paths):
    """Who this job runs as, its HOME, and which of `paths` it can read."""
    seen = {}
    for path in paths:
        try:
            with open(path) as handle:
                handle.read()
            seen[path] = "read"
        except OSError as exc:
            seen[path] = type(exc).__name__
    home = os.environ.get("HOME", "")
    with open(os.path.join(home, "mine"), "w") as handle:  # its HOME is its own
        handle.write("x")
    return {
        "uid": os.getuid(),
        "home": home,
        "home_owner": os.stat(home).st_uid,
        "home_mode": oct(os.stat(home).st_mode & 0o777),
        "names": sorted(os.environ),
        "seen": seen,
    }
'''


# ---------------------------------------------------------------------------- 0600 at once


def _old_secret_key(var: Path) -> None:
    """The previous rule (settings.py before issue 17): written, then chmod-ed."""
    var.mkdir(parents=True, exist_ok=True)
    draft = var / "secret_key"
    draft.write_text("key")
    draft.chmod(0o600)


def _old_auth(path: Path) -> None:
    """The previous rule of scripts/run.py: os.open 0600, chmod after the write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("token: x\n")
    os.chmod(path, 0o600)


def _run_script():
    spec = importlib.util.spec_from_file_location("make_run", ROOT / "scripts" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stale(path: Path) -> Path:
    """An earlier auth.yml, readable by everyone (as older versions could leave it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("token: old\n")
    os.chmod(path, 0o644)
    return path


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_the_secret_key_and_auth_yml_are_0600_when_they_are_created(tmp_path, monkeypatch, umask):
    old = os.umask(umask)
    try:
        stale = _stale(tmp_path / "xdg" / "lakeshore" / "auth.yml")
        made_run = _stale(tmp_path / "home" / ".config" / "lakeshore" / "auth.yml")
        old_auth = _stale(tmp_path / "old" / "auth.yml")
        with monkeypatch.context() as patch:
            calls = []
            patch.setattr(os, "chmod", lambda path, mode, **kw: calls.append(path))
            patch.setattr(os, "fchmod", lambda fd, mode: calls.append(fd))
            patch.setattr(pathlib.Path, "chmod", lambda self, mode, **kw: calls.append(self))
            # every chmod is skipped: a file keeps the mode it was created with, as a
            # reader sees it in the moment before any chmod after the fact
            patch.setattr(server_settings, "VAR_DIR", tmp_path / "var")
            patch.delenv("DJANGO_SECRET_KEY", raising=False)
            patch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
            patch.setenv("HOME", str(tmp_path / "home"))
            key = server_settings._secret_key()
            written = cli_config.write_auth({"server": "http://x", "token": "t"})
            _run_script().write_cli_config("operator-token")
            # negative control: the previous writers, under the same frozen chmod
            _old_secret_key(tmp_path / "old")
            _old_auth(old_auth)
        assert written == stale
        for path in (tmp_path / "var" / "secret_key", stale, made_run):
            assert path.stat().st_mode & 0o777 == 0o600, path
        assert key and (tmp_path / "var").stat().st_mode & 0o777 == 0o700
        assert "token: t" in stale.read_text() and "operator-token" in made_run.read_text()

        assert (tmp_path / "old" / "secret_key").stat().st_mode & 0o777 == 0o666 & ~umask
        assert old_auth.stat().st_mode & 0o777 == 0o644  # the token sat in a 0644 file
        assert "token: x" in old_auth.read_text()
    finally:
        os.umask(old)


# ---------------------------------------------------------------------------- local daemons


@pytest.fixture
def place():
    """A folder any user may pass through (pytest's tmp_path is root's alone): the
    server's var/, HOME and the job module live here, as on a real host."""
    base = Path(tempfile.mkdtemp(prefix="lakeshore-sec-", dir="/tmp"))
    base.chmod(0o755)
    (base / "pkg").mkdir(mode=0o755)
    (base / "pkg" / "jobfiles.py").write_text(textwrap.dedent(JOBFILES))
    (base / "pkg" / "jobfiles.py").chmod(0o644)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def local(live_server, settings, monkeypatch, place):
    """A `local` provider whose daemons can import jobfiles; the server's HOME is
    place/server-home with an operator's auth.yml written as `make run` writes it, and
    its secret key is in place/var. Returns run(config) → the job's report."""
    settings.LAKESHORE_PUBLIC_URL = live_server.url
    settings.VAR_DIR = place / "var"
    settings.LAKESHORE_STARTUP_GRACE = 0
    settings.LAKESHORE_ALLOWED_MODULES = ["jobfiles"]
    monkeypatch.setattr(server_settings, "VAR_DIR", place / "var")
    monkeypatch.delenv("DJANGO_SECRET_KEY", raising=False)
    secret = place / "var" / "secret_key"
    server_settings._secret_key()
    home = place / "server-home"
    home.mkdir(mode=0o755)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    auth = cli_config.write_auth({"server": live_server.url, "token": builders.token()})
    (home / ".config" / "lakeshore").chmod(0o755)  # only the file's own mode protects it
    (home / ".config").chmod(0o755)
    public = home / "public.txt"
    public.write_text("anyone")
    public.chmod(0o644)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join((str(ROOT), str(place / "pkg"))))

    def run(config: dict) -> tuple[dict, Daemon]:
        builders.provider(name="here", kind="local", config={"concurrency": 1, **config})
        queue = builders.queue(
            name="files", provider="here", elasticity_spec={"kind": "fixed", "min": 1}
        )
        builders.tick_queue(queue.pk)
        daemon = Daemon.objects.get()
        paths = [str(auth), str(secret), str(public)]
        inv, _ = services.invocation_submit(function="jobfiles.report", queue="files", args=[paths])
        ended = ("succeeded", "failed")
        wait_for(lambda: Invocation.objects.get(pk=inv.pk).state in ended, what="the job")
        inv.refresh_from_db()
        log = Path(settings.VAR_DIR, "log", "daemons", f"{daemon.name}.log")
        assert inv.state == "succeeded", (inv.error, log.read_text() if log.exists() else "")
        return inv.result, daemon

    run.auth, run.secret, run.public, run.server_home = auth, secret, public, home
    yield run
    for process in DRIVERS["local"].processes.values():
        if process.poll() is None:
            process.kill()
            process.wait(10)
    DRIVERS["local"].processes.clear()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_local_daemons_job_has_a_home_of_its_own_under_a_closed_var(local, place):
    report, daemon = local({})
    home = place / "var" / "homes" / daemon.name
    assert report["home"] == str(home)
    assert report["home_mode"] == "0o700"
    assert (place / "var").stat().st_mode & 0o777 == 0o700
    assert not any(n.startswith(("XDG_", "LAKESHORE_TOKEN")) for n in report["names"])
    assert report["uid"] == 0  # without run_as, the job runs as the server's user


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_negative_control_the_previous_rule_gave_jobs_the_servers_home(local, monkeypatch):
    server_home = {"HOME": os.environ["HOME"]}  # the daemon kept the server's HOME
    monkeypatch.setattr(drivers, "home_environ", lambda env, home, account: env | server_home)
    report, _ = local({})
    assert report["home"] == str(local.server_home)  # where the operator's token is


# ---------------------------------------------------------------------------- run_as


@pytest.fixture
def job_user():
    """A system user made for this test (and removed after); it may pass through /root
    to reach the interpreter (pyenv lives there on this machine), nothing more."""
    if os.geteuid() != 0:
        pytest.skip("run_as is tested as root only: the server must be root to switch users")
    subprocess.run(["userdel", USER], capture_output=True, check=False)
    subprocess.run(["useradd", "--system", "--no-create-home", USER], check=True)
    account = pwd.getpwnam(USER)
    interpreter = Path(os.path.realpath(shutil.which("python3", path=str(ROOT / ".venv/bin"))))
    gates = [p for p in interpreter.parents if not os.stat(p).st_mode & 0o001]
    saved = [(p, os.stat(p).st_mode & 0o7777, private.passers(p)) for p in gates]
    try:
        for gate in gates:
            private.private_dir(gate, traverse=(account.pw_uid,))
        yield account
    finally:
        for gate, mode, users in saved:
            assert not users, f"{gate} had an ACL before: restore it by hand"
            os.removexattr(gate, private.ACL_XATTR)
            os.chmod(gate, mode)
        subprocess.run(["userdel", USER], check=True)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_run_as_runs_daemons_and_jobs_as_that_user_who_cannot_read_the_servers_secrets(
    job_user, local, place
):  # job_user first: it is removed after the daemons are stopped
    report, daemon = local({"run_as": USER})
    home = place / "var" / "homes" / daemon.name
    assert report["uid"] == job_user.pw_uid
    assert report["home"] == str(home) and report["home_owner"] == job_user.pw_uid
    assert report["home_mode"] == "0o700"
    seen = report["seen"]
    assert seen[str(local.auth)] == "PermissionError"  # 0600, the server's
    assert seen[str(local.secret)] == "PermissionError"
    assert seen[str(local.public)] == "read"  # control: it does reach the server's HOME
    assert (place / "var").stat().st_mode & 0o007 == 0  # others: nothing
    assert private.passers(place / "var") == {job_user.pw_uid}


def test_run_as_names_a_user_of_this_host_and_needs_a_root_server(monkeypatch):
    assert config_errors("local", {"run_as": "no-such-user-here"}) == {
        "config.run_as": "no user 'no-such-user-here' on the server's host"
    }
    assert "must be a user name" in config_errors("local", {"run_as": "-x"})["config.run_as"]
    nobody = pwd.getpwnam("nobody").pw_uid
    monkeypatch.setattr(os, "geteuid", lambda: nobody)
    error = config_errors("local", {"run_as": "daemon"})["config.run_as"]
    assert "runs as 'nobody', not root: it cannot start daemons as 'daemon'" in error
    with pytest.raises(driver_base.ProviderError, match="run_as: the server runs as"):
        driver_base.run_as_account("daemon")
    assert config_errors("local", {"run_as": "nobody"}) == {}


@pytest.mark.django_db
def test_run_as_never_names_root(monkeypatch):
    """Root by any name (uid 0) is refused with a 400 naming the key, whoever the server
    runs as; where the daemons start, it is refused again. Control: an unprivileged
    user of the host is taken."""
    operator = APIClient()
    operator.credentials(**builders.auth(builders.token("operator")))
    root = pwd.getpwuid(0).pw_name
    add = {"name": "here", "kind": "local", "config": {"run_as": root}}

    refused = operator.post("/api/v1/providers/", add, format="json")

    assert_error(refused, 400, "invalid", field="config.run_as", says="root (uid 0)")
    with pytest.raises(driver_base.ProviderError, match="uid 0"):
        driver_base.run_as_account(root)
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # a server run as root may switch users
    add["config"]["run_as"] = "nobody"
    assert operator.post("/api/v1/providers/", add, format="json").status_code == 201
