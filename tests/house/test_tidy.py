"""Leave things as we found them: `make test` leaves no database server running, and
`make run` never re-points a `lakeshore` link that belongs to another checkout."""

import fcntl
import importlib.util
import os
import subprocess
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from lakeshore_admin import embedded_db

ROOT = Path(__file__).resolve().parents[2]


# --- make test: the migration check ------------------------------------------------------------


def makefile_step(text: str) -> str:
    """The Makefile's own command line for a step of `make test` (as `make -n` prints it)."""
    printed = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60
    ).stdout
    lines = [line for line in printed.splitlines() if text in line]
    assert len(lines) == 1, printed
    return lines[0]


def server_running(pgdata: Path) -> bool:
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        return psutil.Process(pid).name() == "postgres"
    except (OSError, ValueError, psutil.Error):
        return False


@pytest.mark.slow
def test_the_migration_check_leaves_no_server_of_its_own(tmp_path):
    """Run the step as `make test` does, in a shell without the test settings. Where a
    server of its own would go (var/pg under a fresh LAKESHORE_VAR_DIR), none may be
    left running; the tests' server (which pytest stops at the end) must still run."""
    if settings.EMBEDDED_PGDATA is None:
        pytest.skip("DATABASE_URL is set: the step starts no embedded server at all")
    step = makefile_step("makemigrations --check")
    var = tmp_path / "var"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DJANGO_SETTINGS_MODULE", "LAKESHORE_PGDATA") and not k.startswith("PYTEST")
    }
    env.update(LAKESHORE_VAR_DIR=str(var), LAKESHORE_TEST_PGDATA=str(settings.EMBEDDED_PGDATA))
    try:
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", step],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert not server_running(var / "pg"), "the migration check left a server under var/pg"
        assert server_running(settings.EMBEDDED_PGDATA), "the step stopped the tests' server"
    finally:
        if server_running(var / "pg"):  # started by the step under test: ours to stop
            embedded_db.stop(var / "pg")


# --- make run: the `lakeshore` link ------------------------------------------------------------


@pytest.fixture
def run(monkeypatch, tmp_path):
    """scripts/run.py, with HOME and PATH in a temporary directory: ~/.local/bin is the
    one candidate on PATH (and /usr/local/bin is not)."""
    home = tmp_path / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", str(home / ".local" / "bin"))
    spec = importlib.util.spec_from_file_location("make_run", ROOT / "scripts" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.link = home / ".local" / "bin" / "lakeshore"
    module.ours = ROOT / ".venv" / "bin" / "lakeshore"
    return module


def other_checkout(tmp_path, *, exists: bool = True) -> Path:
    program = tmp_path / "elsewhere" / "lakeshore-admin" / ".venv" / "bin" / "lakeshore"
    if exists:
        program.parent.mkdir(parents=True)
        program.write_text("#!/bin/sh\necho other\n")
        program.chmod(0o755)
    return program


def test_it_links_when_there_is_no_link(run):
    message = run.link_cli()
    assert run.link.is_symlink() and run.link.resolve() == run.ours.resolve()
    assert message == f"linked {run.link} -> {run.ours}"


def test_it_keeps_its_own_link(run):
    run.link.symlink_to(run.ours)
    before = run.link.lstat()
    message = run.link_cli()
    assert message == f"lakeshore is on PATH ({run.link})"
    assert run.link.lstat().st_ino == before.st_ino  # not even re-created


def serving(program: Path):
    """The checkout of `program` as its make run holds it: its var/make-run.lock locked."""
    lock = program.parents[2] / "var" / "make-run.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock, "a+")  # noqa: SIM115 - the caller closes it
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return handle


def test_it_leaves_the_link_of_another_checkout_that_serves_alone(run, tmp_path):
    theirs = other_checkout(tmp_path)
    run.link.symlink_to(theirs)
    with serving(theirs):
        message = run.link_cli()
    assert os.readlink(run.link) == str(theirs)
    assert message.startswith(f"left {run.link} alone: it points at {theirs}")
    assert "another checkout" in message and "which serves now" in message
    assert "run 'make shell'" in message and str(run.ours) in message


def test_it_re_points_the_link_of_a_checkout_that_serves_no_more(run, tmp_path):
    theirs = other_checkout(tmp_path)
    run.link.symlink_to(theirs)
    serving(theirs).close()  # it served once: its lock file is there, and free
    message = run.link_cli()
    assert run.link.resolve() == run.ours.resolve()
    assert message == (
        f"linked {run.link} -> {run.ours} (it pointed at {theirs}, another checkout, "
        f"{theirs.parents[2]}, whose make run is not running)"
    )


def test_it_leaves_any_other_live_link_alone(run, tmp_path):
    theirs = tmp_path / "opt" / "lakeshore"
    theirs.parent.mkdir()
    theirs.write_text("#!/bin/sh\n")
    theirs.chmod(0o755)
    run.link.symlink_to(theirs)
    message = run.link_cli()
    assert os.readlink(run.link) == str(theirs)
    assert "alone" in message and "not this checkout" in message


def test_it_re_points_a_dangling_link_and_says_so(run, tmp_path):
    gone = other_checkout(tmp_path, exists=False)
    run.link.symlink_to(gone)
    message = run.link_cli()
    assert run.link.resolve() == run.ours.resolve()
    assert message == f"linked {run.link} -> {run.ours} (it pointed at {gone}, which is gone)"


def test_it_leaves_a_program_that_is_not_a_link_alone(run):
    run.link.write_text("#!/bin/sh\necho mine\n")
    run.link.chmod(0o755)
    message = run.link_cli()
    assert not run.link.is_symlink() and "echo mine" in run.link.read_text()
    assert "export PATH=" in message
