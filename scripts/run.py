"""`make run`: migrate, create the admin and a token on first start, then serve the
console until Ctrl-C. Runs inside .venv; stops the embedded PostgreSQL on the way out."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lakeshore.private import private_dir, write_private  # noqa: E402 - ROOT on sys.path first

PY = sys.executable
PORT = os.environ.get("PORT", "8080")
BIND = os.environ.get("LAKESHORE_BIND", "127.0.0.1")
DEV = "--dev" in sys.argv  # `make dev`: Django's runserver, reloading on code changes
URL = f"http://{'127.0.0.1' if BIND in ('0.0.0.0', '::') else BIND}:{PORT}"  # noqa: S104


def manage(*args: str, capture: bool = False) -> str:
    result = subprocess.run(
        [PY, "manage.py", *args], cwd=ROOT, check=True, text=True, capture_output=capture
    )
    return result.stdout if capture else ""


def write_cli_config(token: str) -> str:
    """Point the `lakeshore` CLI at this server, unless it is set up for another one."""
    import yaml

    path = Path.home() / ".config" / "lakeshore" / "auth.yml"
    if path.exists():
        current = yaml.safe_load(path.read_text()) or {}
        if current.get("server") not in (None, URL, f"http://localhost:{PORT}"):
            return f"left {path} alone (it points at {current.get('server')})"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(path, yaml.safe_dump({"server": URL, "token": token}))  # 0600 from the start
    return f"wrote {path} (mode 0600): the lakeshore CLI works from any shell"


def link_cli() -> str:
    """Put `lakeshore` on PATH so the cookbook's examples work in any shell. A link that
    belongs to another checkout (or anything else that is not ours) is left alone: it
    says so instead. A dangling link is re-pointed."""
    import shutil

    ours = ROOT / ".venv" / "bin" / "lakeshore"
    found = shutil.which("lakeshore")
    if found and Path(found).resolve() == ours.resolve():
        return f"lakeshore is on PATH ({found})"
    path_dirs = [Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    candidates = [Path.home() / ".local" / "bin", Path("/usr/local/bin")]
    for directory in candidates:
        target = directory / "lakeshore"
        if directory not in path_dirs or not os.access(directory, os.W_OK):
            continue
        if target.exists() and not target.is_symlink():
            continue  # somebody else's lakeshore: leave it alone
        previous = os.readlink(target) if target.is_symlink() else None
        if previous and target.exists():  # a live link: ours, or somebody else's
            if target.resolve() == ours.resolve():
                return f"{target} points at {ours} (check that it comes before {found} on PATH)"
            owner = _checkout_of(target.resolve())
            whose = f"another checkout, {owner}" if owner else "not this checkout"
            return (
                f"left {target} alone: it points at {previous} ({whose}); "
                f"run ours as {ours} or re-link by hand"
            )
        if previous:
            target.unlink()  # dangling: what it pointed at is gone
        target.symlink_to(ours)
        if previous:
            return f"linked {target} -> {ours} (it pointed at {previous}, which is gone)"
        if found and Path(found) != target:
            return f"linked {target} -> {ours} (check that it comes before {found} on PATH)"
        return f"linked {target} -> {ours}"
    return f"put it on PATH with: export PATH={ours.parent}:$PATH"


def _checkout_of(program: Path) -> Path | None:
    """The checkout a `<checkout>/.venv/bin/lakeshore` belongs to, else None."""
    if program.parent.name == "bin" and program.parent.parent.name == ".venv":
        return program.parent.parent.parent
    return None


def wait_healthy(proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"The web server exited with code {proc.returncode}; see above.")
        try:
            with urllib.request.urlopen(f"{URL}/readyz", timeout=1) as response:  # noqa: S310
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"The web server was not ready ({URL}/readyz) within {timeout:.0f} s.")


def single_instance():
    """One `make run` per checkout: a second one would fight over the port and stop the
    first one's database on its way out."""
    import fcntl

    var = private_dir(Path(os.environ.get("LAKESHORE_VAR_DIR", ROOT / "var")))  # 0700
    handle = open(var / "make-run.lock", "a+")  # noqa: SIM115 - held for the process's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        sys.exit(f"make run is already running here (pid {holder}); stop it first.")
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def die_with_parent() -> None:
    """In a child: get SIGTERM when make run dies, even by kill -9 (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main() -> None:
    os.chdir(ROOT)
    lock = single_instance()  # noqa: F841 - the lock lives as long as this process
    os.environ.setdefault("LAKESHORE_PUBLIC_URL", URL)  # for daemons the local provider starts
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")
    import django

    django.setup()  # starts (or attaches to) the embedded PostgreSQL when no DATABASE_URL
    from django.conf import settings

    print("Migrating the database…", flush=True)
    manage("migrate", "--no-input", "-v", "0")
    boot = json.loads(manage("bootstrap", capture=True))

    procs: list[subprocess.Popen] = []
    manage("collectstatic", "--no-input", "-v", "0")  # WhiteNoise serves var/static
    # GET /metrics adds up the counters every process left in this directory (even
    # processes of an earlier run): a fresh start counts from zero, like any restart.
    for stale in Path(settings.LAKESHORE_METRICS_DIR).glob("*.db"):
        stale.unlink()
    if DEV:
        command = [PY, "manage.py", "runserver", f"{BIND}:{PORT}", "--insecure"]
    else:  # the production server (lakeshore_admin/gunicorn_conf.py)
        command = [str(Path(PY).parent / "gunicorn"), "-c", "python:lakeshore_admin.gunicorn_conf"]
    web = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "PORT": PORT, "LAKESHORE_BIND": BIND},
        preexec_fn=die_with_parent,  # noqa: PLW1509 - no threads yet in this process
    )
    procs.append(web)
    # One Celery worker with beat inside (-B): the reaper and, later, elasticity ticks.
    celery = subprocess.Popen(
        [
            str(Path(PY).parent / "celery"),
            "--quiet",
            "-A",
            "lakeshore_admin",
            "worker",
            "-B",
            "--pool=solo",
            "--loglevel=warning",
            "--hostname=lakeshore@%h",
        ],
        cwd=ROOT,
        preexec_fn=die_with_parent,  # noqa: PLW1509
        # As root (these machines) Celery warns on every start; the worker runs JSON only.
        env={**os.environ, "PYTHONWARNINGS": "ignore:You're running the worker with superuser"},
    )
    procs.append(celery)

    def shutdown(*_):
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if settings.EMBEDDED_PGDATA is not None:
            from django.db import connections

            connections.close_all()
            from lakeshore_admin import embedded_db

            embedded_db.stop(settings.EMBEDDED_PGDATA)
        print("Stopped.", flush=True)

    # Ctrl-C stops everything, even when a shell started us with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(0))  # the terminal went away
    try:
        wait_healthy(web)
        server = "runserver (make dev, reloads on changes)" if DEV else "gunicorn"
        lines = ["", f"Lakeshore Admin is up: {URL}/  ({server})"]
        lines.append(f"  console: {URL}/   Django admin: {URL}/admin/   API: {URL}/api/v1/")
        lines.append(f"  API docs: {URL}/api/docs/")
        lines.append(
            f"  Celery worker and beat: running (reaper every {settings.LAKESHORE_TICK_SECONDS} s)"
        )
        if boot["created"]:
            lines.append(f"  admin login: {boot['username']} / {boot['password']}  (shown once)")
            lines.append(f"  API token (operator): {boot['token']}  (shown once)")
            lines.append(f"  CLI: {write_cli_config(boot['token'])}")
            lines.append(f"    or: export LAKESHORE_URL={URL} LAKESHORE_TOKEN={boot['token']}")
        else:
            lines.append(
                f"  admin login: {boot['username']} (password shown at first start; "
                "'make admin-password' sets a new one)"
            )
            lines.append("  API token: 'make token' prints a new operator token")
        lines.append(f"  lakeshore CLI: {link_cli()}")
        lines.append("Press Ctrl-C to stop.")
        print("\n".join(lines), flush=True)
        while all(proc.poll() is None for proc in procs):
            time.sleep(0.5)
        gone = next(proc for proc in procs if proc.poll() is not None)
        name = "The web server" if gone is web else "The Celery worker"
        sys.exit(f"{name} exited with code {gone.returncode} (see above); stopping the rest.")
    except KeyboardInterrupt:
        pass
    finally:
        shutdown()


if __name__ == "__main__":
    main()
