"""Issue 20, "A bad environment value prints a traceback": every setting read from the
environment, given a bad value, ends the real command with one line naming the variable,
the value and what is expected, and nothing else, and a non-zero status. The variables
are found in the source (every env_*("NAME") read), so a new setting cannot skip this:
one that takes any text must be listed in FREE_TEXT with the reason."""

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
# Where the server reads its settings from the environment.
SOURCES = [
    ROOT / "lakeshore_admin" / "settings.py",
    ROOT / "lakeshore_admin" / "settings_limits.py",
    ROOT / "lakeshore_admin" / "gunicorn_conf.py",
    ROOT / "scripts" / "run.py",
]
READ = re.compile(r"""env_(number|bool|str|list)\(\s*["']([A-Z][A-Z0-9_]*)["']""")
RAW = re.compile(
    r"""(?:os\.environ(?:\.get|\.setdefault)?\(?\[?|getenv\()\s*["']([A-Z][A-Z0-9_]*)"""
)
# Read raw on purpose: not settings (where a process finds its settings, or a value
# written for the processes it starts).
RAW_ALLOWED = {"DJANGO_SETTINGS_MODULE", "LAKESHORE_PUBLIC_URL", "PATH"}
BAD = {
    "number": "abc",
    "bool": "maybe",
    "log_level": "loud",
}
# Text settings that can be wrong, and a wrong value for each.
BAD_TEXT = {
    "DATABASE_URL": "mysql://someone:secret@db/lakeshore",
    "LAKESHORE_API_RATE": "lots",
    "LAKESHORE_VAR_DIR": "/proc/lakeshore",
    "LAKESHORE_PGDATA": "/proc/lakeshore/pg",
    "CSRF_TRUSTED_ORIGINS": "admin.example.com",
    "LAKESHORE_PUBLIC_URL": "127.0.0.1:8080",
    "LAKESHORE_ALLOWED_MODULES": "my_jobs,my-jobs",
    "LAKESHORE_SLURM_CONF_DIRS": "etc/slurm",
}
FREE_TEXT = {
    "DJANGO_SECRET_KEY": "any text is a key",
    "ALLOWED_HOSTS": "host names and patterns; a wrong one refuses requests (400), as Django does",
    "LAKESHORE_SDK_NAMESPACE": "any name; other namespaces answer 404",
    "LAKESHORE_BROKER_URL": "kombu's URLs; the worker says which it cannot reach",
    "LAKESHORE_BIND": "an address; gunicorn says when it cannot listen there",
}
DUMMY_DB = "postgresql://nobody@127.0.0.1:1/none"  # parsed, never reached by these checks


def discovered(*sources: Path) -> dict[str, str]:
    found = {}
    for source in sources or SOURCES:
        for kind, name in READ.findall(source.read_text()):
            found.setdefault(name, "log_level" if name.endswith("_LOG_LEVEL") else kind)
    return found


def sandbox_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LAKESHORE_", "DJANGO_", "DATABASE_URL", "PROMETHEUS_", "XDG_"))
    }
    env = {
        **keep,
        "HOME": str(tmp_path),
        "LAKESHORE_VAR_DIR": str(tmp_path / "var"),
        "DATABASE_URL": DUMMY_DB,
        "LAKESHORE_HTTPS": "1",  # its own settings are read only then
        # a server that gets past its settings binds a free port, never the default one
        # (8080, which `make run` may hold: test_no_server_here_needs_port_8080)
        "PORT": str(free_port()),
    }
    env.update(extra)
    if "LAKESHORE_PGDATA" in extra:
        del env["DATABASE_URL"]  # read only for the embedded server
    return env


def bad_value(name: str, kind: str) -> str:
    return BAD_TEXT[name] if name in BAD_TEXT else BAD[kind]


def assert_one_line(result: subprocess.CompletedProcess, name: str, value: str) -> None:
    shown = value.split("://", 1)[0] + "://…" if name == "DATABASE_URL" else value
    assert result.returncode != 0, result.stdout + result.stderr
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{name}={shown!r}: expected "), lines


SETTINGS = discovered()
CHECKED = sorted(n for n, kind in SETTINGS.items() if kind in BAD or n in BAD_TEXT)
READ_BY = {
    source: sorted(set(discovered(ROOT / source)) & set(CHECKED))
    for source in (
        "lakeshore_admin/settings.py",
        "lakeshore_admin/gunicorn_conf.py",
        "scripts/run.py",
    )
}


def test_every_setting_has_a_bad_value_or_a_reason_to_take_any_text():
    assert len(SETTINGS) > 50  # the discovery sees the settings (a control of the regex)
    unclassified = [
        n for n, kind in SETTINGS.items() if kind not in BAD and n not in {*BAD_TEXT, *FREE_TEXT}
    ]
    assert not unclassified, (
        f"give these a check (BAD_TEXT) or a reason (FREE_TEXT): {unclassified}"
    )
    assert not set(FREE_TEXT) - set(SETTINGS), "FREE_TEXT names a variable nothing reads"


def test_settings_are_read_through_lakeshore_admin_env():
    raw = {name for source in SOURCES for name in RAW.findall(source.read_text())}
    assert not raw - RAW_ALLOWED, "read these with lakeshore_admin.env (one-line errors)"


@pytest.mark.parametrize("name", READ_BY["lakeshore_admin/settings.py"])
def test_a_bad_value_is_one_line_from_manage_py(tmp_path, name):
    value = bad_value(name, SETTINGS[name])
    env = sandbox_env(tmp_path, **{name: value})
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line(result, name, value)


def test_the_control_a_good_environment_passes_the_check(tmp_path):
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=sandbox_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "name", [*READ_BY["lakeshore_admin/gunicorn_conf.py"], "LAKESHORE_TICK_SECONDS"]
)
def test_a_bad_value_is_one_line_from_gunicorn(tmp_path, name):
    value = bad_value(name, SETTINGS[name])
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "gunicorn"), "-c", "python:lakeshore_admin.gunicorn_conf"],
        cwd=ROOT,
        env=sandbox_env(tmp_path, **{name: value}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line(result, name, value)


@pytest.fixture
def port_8080_held():
    """127.0.0.1:8080 held by another process's socket (this one's), as `make run` holds
    it; if something holds it already, that is the same case."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8080))
        holder.listen()
    except OSError:
        pass  # taken already
    try:
        yield
    finally:
        holder.close()


def test_no_server_here_needs_port_8080(tmp_path, port_8080_held):
    """The check the issue asked for: with 8080 taken, a server that starts past its
    settings still starts (on sandbox_env's free port) and says its one line."""
    value = bad_value("LAKESHORE_TICK_SECONDS", SETTINGS["LAKESHORE_TICK_SECONDS"])
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "gunicorn"), "-c", "python:lakeshore_admin.gunicorn_conf"],
        cwd=ROOT,
        env=sandbox_env(tmp_path, LAKESHORE_TICK_SECONDS=value),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Address already in use" not in result.stderr
    assert_one_line(result, "LAKESHORE_TICK_SECONDS", value)


def test_a_bad_value_is_one_line_from_celery(tmp_path):
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "celery"), "-A", "lakeshore_admin", "worker"],
        cwd=ROOT,
        env=sandbox_env(tmp_path, LAKESHORE_TICK_SECONDS="abc"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line(result, "LAKESHORE_TICK_SECONDS", "abc")


@pytest.mark.parametrize("name", [*READ_BY["scripts/run.py"], "LAKESHORE_TICK_SECONDS"])
def test_a_bad_value_is_one_line_from_make_run(tmp_path, name):
    """scripts/run.py as `make run` starts it: PORT is read by the first process, the
    rest by the supervisor as it loads the settings (nothing is started yet)."""
    value = bad_value(name, SETTINGS[name])
    env = sandbox_env(tmp_path, PATH=f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin", **{name: value})
    result = subprocess.run(
        [sys.executable, "scripts/run.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line(result, name, value)


@pytest.mark.parametrize("taken", [True, False])
def test_a_port_another_server_holds_is_refused_in_one_line(tmp_path, taken):
    """Each worker listens on a socket of its own (reuse_port), which would let a second
    server share a port silently: gunicorn refuses a port in use, in one line. The
    control: the same port, free, is served."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    if taken:
        holder.listen()
    else:
        holder.close()
    server = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "gunicorn"), "-c", "python:lakeshore_admin.gunicorn_conf"],
        cwd=ROOT,
        env=sandbox_env(tmp_path, PORT=str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its workers too are stopped at the end
    )
    try:
        if taken:
            _, err = server.communicate(timeout=120)
            assert server.returncode != 0
            lines = [line for line in err.splitlines() if line.strip()]
            assert lines == [
                f"cannot listen at 127.0.0.1:{port}: Address already in use "
                "(is another server running?)"
            ], err
        else:
            with pytest.raises(subprocess.TimeoutExpired):
                server.communicate(timeout=5)  # it serves
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        server.communicate(timeout=30)
        holder.close()
