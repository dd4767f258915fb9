"""`make run`: migrate, create the admin and a token on first start, then serve the
console until Ctrl-C. Runs inside .venv.

Two processes of this script. The one `make` starts stays in the terminal and does
nothing but start the other, the supervisor, in a session of its own, and pass it one
SIGTERM when asked to stop (Ctrl-C, Ctrl-C again, SIGTERM, the terminal closing). The
supervisor starts the embedded PostgreSQL, gunicorn and the Celery worker, each of those
in a session of its own too, and stops them in order: the Celery worker and the local
provider's daemons first (they deregister while the web server still answers), then
gunicorn, then PostgreSQL. The terminal's signals reach neither gunicorn nor Celery: a
second quit signal makes gunicorn's workers drop their open requests, and Celery's
cancels a task the solo pool cannot cancel. Each gets one SIGTERM from the supervisor,
and SIGKILL if it outlives its time. If the first process is killed (kill -9), the
kernel sends the supervisor SIGTERM (PR_SET_PDEATHSIG): the same stop. The supervisor
is a subreaper: whatever its children leave behind becomes its child, and nothing of it
outlives the stop."""

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import django  # noqa: E402
from django.conf import settings  # noqa: E402 - read once django.setup() has run
from django.contrib.staticfiles.finders import get_finders  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402

from lakeshore.private import private_dir, write_private  # noqa: E402 - ROOT on sys.path first
from lakeshore_admin import embedded_db  # noqa: E402
from lakeshore_admin.env import BadSetting, access_log, env_number, env_str, var_dir  # noqa: E402
from scripts.processes import (  # noqa: E402
    PR_SET_CHILD_SUBREAPER,
    die_with_parent,
    kill_group,
    prctl,
    running,
    with_suppress,
)

PY = sys.executable
DEV = "--dev" in sys.argv  # `make dev`: Django's runserver, reloading on code changes
try:
    PORT = str(env_number("PORT", 8080, minimum=1, maximum=65535))
except BadSetting as exc:
    sys.exit(str(exc))
BIND = env_str("LAKESHORE_BIND", "127.0.0.1")
URL = f"http://{'127.0.0.1' if BIND in ('0.0.0.0', '::') else BIND}:{PORT}"  # noqa: S104
VAR = var_dir()
CREDENTIALS = VAR / "credentials"

# How long each part may take to stop before the next step (seconds): at most 14 in all.
# The worker waits 9 s for its daemons (fleet/tasks.py); an idle one leaves 5-7 s after
# its SIGTERM (it waits out its long-poll claim).
CELERY_KILL = 11  # then SIGKILL: the worker, its beat and what is left of its daemons
WEB_KILL = 2  # gunicorn's own graceful timeout is one less (it kills its workers first)
DB_STOP = 1  # pg_ctl's fast shutdown, then SIGKILL (the next start recovers)


def say(text: str) -> None:
    with contextlib.suppress(OSError):  # the terminal is gone (SIGHUP): nothing to tell
        print(text, flush=True)


def manage(*args: str) -> str:
    """A management command, in this process (Django is set up): what it printed."""
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def write_cli_config(token: str) -> str:
    """Point the `lakeshore` CLI at this server, unless it is set up for another one."""
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
        stale = None
        if previous and target.exists():  # a live link: ours, or somebody else's
            if target.resolve() == ours.resolve():
                return f"{target} points at {ours} (check that it comes before {found} on PATH)"
            owner = _checkout_of(target.resolve())
            if owner is None or _serving(owner):
                whose = (
                    f"another checkout, {owner}, which serves now" if owner else "not this checkout"
                )
                return (
                    f"left {target} alone: it points at {previous} ({whose}); in this "
                    f"checkout run 'make shell', or {ours}, or re-link by hand"
                )
            stale = f"another checkout, {owner}, whose make run is not running"
        if previous:
            target.unlink()  # dangling, or a checkout that serves no more
        target.symlink_to(ours)
        if previous:
            why = stale or "which is gone"
            return f"linked {target} -> {ours} (it pointed at {previous}, {why})"
        if found and Path(found) != target:
            return f"linked {target} -> {ours} (check that it comes before {found} on PATH)"
        return f"linked {target} -> {ours}"
    return f"put it on PATH with: export PATH={ours.parent}:$PATH"


def _serving(checkout: Path) -> bool:
    """Whether `make run` runs in that checkout now: it holds its var/make-run.lock
    (single_instance). A checkout with no lock file has never served, or not here."""
    try:
        handle = os.open(checkout / "var" / "make-run.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(handle)  # and with it any lock just taken
    return False


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
    first one's database on its way out. A `make run` that is stopping is waited for."""
    try:
        var = private_dir(VAR)  # 0700
    except OSError as exc:
        raise BadSetting(
            "LAKESHORE_VAR_DIR", str(VAR), f"a directory this user can create ({exc.strerror})"
        ) from None
    handle = open(var / "make-run.lock", "a+")  # noqa: SIM115 - held for the process's life
    deadline = time.monotonic() + 20
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().split()
            if holder[1:] == ["stopping"] and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            pid = holder[0] if holder else "another process"
            sys.exit(f"make run is already running here (pid {pid}); stop it first.")
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


class Stop(Exception):  # noqa: N818 - a request, not an error
    """Raised by the first stop signal, while the supervisor starts or runs."""


# --------------------------------------------------------------------- the first process


def front() -> None:
    """In the terminal: start the supervisor, pass it one SIGTERM on the first stop
    signal, and wait for it."""
    supervisor = subprocess.Popen(
        [PY, __file__, "--supervise", str(os.getpid()), *(["--dev"] if DEV else [])],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # the terminal's Ctrl-C reaches this process alone
        preexec_fn=die_with_parent,  # noqa: PLW1509 - no threads in this process
    )
    asked = []

    def stop(signum, frame):
        if not asked:
            supervisor.send_signal(signal.SIGTERM)
        elif len(asked) == 1:
            say(
                "Still stopping: the daemons deregister first, then the web server and the "
                f"database stop (at most {CELERY_KILL + WEB_KILL + DB_STOP + 1} s)."
            )
        asked.append(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    sys.exit(supervisor.wait())


# ------------------------------------------------------------------------ the supervisor


class Supervisor:
    def __init__(self):
        self.web: subprocess.Popen | None = None
        self.celery: subprocess.Popen | None = None
        self.lock = None  # make-run.lock, once held
        self.django_ready = False  # the settings loaded (a bad one raises BadSetting)
        self.stopping = False
        self.exit_code = 0

    def on_signal(self, signum, frame):
        if not self.stopping:
            self.stopping = True
            raise Stop
        # already stopping: the order below goes on, each step bounded

    def start(self, command: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # signals come from here alone, once each
            preexec_fn=die_with_parent,  # noqa: PLW1509 - no threads in this process
            **kwargs,
        )

    def reap(self) -> None:
        """Collect the children this subreaper inherited (never the Popen ones)."""
        ours = {p.pid for p in (self.web, self.celery) if p is not None}
        for child in psutil.Process().children():
            if child.pid in ours:
                continue
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError):
                pass

    def daemons(self) -> list[psutil.Process]:
        """The processes the Celery worker started from other programs: the local
        provider's daemons (its own forks, such as beat, run its program)."""
        try:
            worker = psutil.Process(self.celery.pid)
            program = worker.cmdline()
            return [p for p in worker.children() if p.cmdline() != program]
        except psutil.Error:
            return []

    def stop(self) -> None:
        self.stopping = True
        self.lock.seek(0)
        self.lock.truncate()
        self.lock.write(f"{os.getpid()} stopping")
        self.lock.flush()
        started = self.web is not None or self.celery is not None
        if started:
            say("Stopping: the daemons, the Celery worker, the web server, then the database…")
        self.stop_celery()
        self.stop_web()
        if self.django_ready:
            pgdata = settings.EMBEDDED_PGDATA
            close_database()
        elif not env_str("DATABASE_URL"):  # a bad setting after the server started
            pgdata = Path(env_str("LAKESHORE_PGDATA", str(VAR / "pg")))
        else:
            pgdata = None
        if pgdata is not None:
            embedded_db.stop(pgdata, timeout=DB_STOP, modes=("fast",))
        self.sweep()
        if started:
            say("Stopped.")

    def stop_celery(self) -> None:
        """The worker takes no more tasks (warm shutdown: the one running ends), gives
        its daemons one SIGTERM and waits for them (fleet/tasks.py): they drain and
        deregister while the web server still answers them. Past CELERY_KILL seconds,
        the worker and what is left of its daemons are killed."""
        if self.celery is None:
            return
        started = time.monotonic()
        daemons: dict[int, psutil.Process] = {}
        if self.celery.poll() is None:
            self.celery.send_signal(signal.SIGTERM)
        while True:
            for daemon in self.daemons():  # those a running tick started too
                daemons.setdefault(daemon.pid, daemon)
            alive = [d for d in daemons.values() if running(d)]
            if self.celery.poll() is not None and not alive:
                break
            if time.monotonic() - started > CELERY_KILL:
                kill_group(self.celery.pid)
                for daemon in alive:
                    kill_group(daemon.pid)
                    with_suppress(daemon.kill)
                self.celery.wait()
                break
            self.reap()
            time.sleep(0.05)
        self.reap()

    def stop_web(self) -> None:
        if self.web is None:
            return
        if self.web.poll() is None:
            self.web.send_signal(signal.SIGTERM)  # graceful: parked long-polls answer at once
        try:
            self.web.wait(WEB_KILL)
        except subprocess.TimeoutExpired:
            kill_group(self.web.pid)
            self.web.wait()
        kill_group(self.web.pid)  # workers that outlived their master, if any

    def sweep(self) -> None:
        """Nothing this supervisor started (or inherited) outlives it."""
        left = psutil.Process().children(recursive=True)
        for process in left:
            with_suppress(process.kill)
        psutil.wait_procs(left, timeout=5)
        self.reap()

    def run(self) -> None:
        os.chdir(ROOT)
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self.on_signal)
        front_pid = int(sys.argv[sys.argv.index("--supervise") + 1])
        try:
            if os.getppid() != front_pid:  # it died before the death signal was armed
                raise Stop
            self.lock = single_instance()
            self.serve()
        except Stop:
            pass
        finally:
            self.stopping = True  # a signal from now on changes nothing: each step is bounded
            if self.lock is not None:
                self.stop()

    def serve(self) -> None:
        os.environ.setdefault("LAKESHORE_PUBLIC_URL", URL)  # for the local provider's daemons
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")
        django.setup()  # starts (or attaches to) the embedded PostgreSQL when no DATABASE_URL
        self.django_ready = True

        say("Migrating the database…")
        manage("migrate", "--no-input", "-v", "0")
        boot = json.loads(manage("bootstrap"))
        collect_static()
        tidy_broker()
        close_database()  # the children open their own
        if DEV:
            command = [PY, "manage.py", "runserver", f"{BIND}:{PORT}", "--insecure"]
        else:  # the production server (lakeshore_admin/gunicorn_conf.py)
            gunicorn = str(Path(PY).parent / "gunicorn")
            command = [gunicorn, "-c", "python:lakeshore_admin.gunicorn_conf"]
            command += ["--graceful-timeout", str(WEB_KILL - 1)]
        self.web = self.start(command, env={**os.environ, "PORT": PORT, "LAKESHORE_BIND": BIND})
        # One Celery worker with beat inside (-B): the reaper and the elasticity ticks.
        self.celery = self.start(
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
            # As root (these machines) Celery warns on every start; the worker runs JSON only.
            env={**os.environ, "PYTHONWARNINGS": "ignore:You're running the worker with superuser"},
        )
        wait_healthy(self.web)
        say(banner(boot))
        while self.web.poll() is None and self.celery.poll() is None:
            self.reap()
            time.sleep(0.5)
        gone, name = (
            (self.web, "The web server")
            if self.web.poll() is not None
            else (self.celery, "The Celery worker")
        )
        say(f"{name} exited with code {gone.returncode} (see above); stopping the rest.")
        self.exit_code = 1


def close_database() -> None:
    """Close this process's connections and their pool (whose thread would otherwise
    reconnect while the server stops, and log each try)."""
    connections.close_all()
    for connection in connections.all(initialized_only=True):
        connection.close_pool()


def tidy_broker() -> None:
    """The filesystem broker's leftovers of a writer killed mid-message: a part written
    (lakeshore_admin/broker.py), or an empty message (kombu's own writer, before it)."""
    options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None)
    if not options:
        return
    folder = Path(options["data_folder_in"])
    for path in folder.glob("*.msg.part"):
        path.unlink(missing_ok=True)
    for path in folder.glob("*.msg"):
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()


def collect_static() -> None:
    """collectstatic (WhiteNoise serves var/static), unless no static file changed since
    the last one: it compresses every file again, which costs a second at each start."""
    digest = hashlib.sha256()
    for finder in get_finders():
        for path, storage in sorted(finder.list([]), key=lambda found: found[0]):
            stat = os.stat(storage.path(path))
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    stamp = Path(settings.STATIC_ROOT) / ".collected"
    if stamp.is_file() and stamp.read_text() == digest.hexdigest():
        return
    manage("collectstatic", "--no-input", "-v", "0")
    stamp.write_text(digest.hexdigest())


def save_credentials(boot: dict) -> Path:
    """The first start's admin login and token, in var/credentials (0600 from the start),
    so that they stay reachable once the terminal has scrolled ('make credentials')."""
    token = boot["token"]
    text = "\n".join(
        [
            f"# make run's first start, for {URL}",
            f"admin login: {boot['username']} / {boot['password']}",
            f"API token (operator): {token}",
            f"CLI: export LAKESHORE_URL={URL} LAKESHORE_TOKEN={token}",
            f"Python SDK: export LAKESHORE_URL={URL} LAKESHORE_CLIENT_TOKEN={token}",
            "",
        ]
    )
    return write_private(CREDENTIALS, text)


def banner(boot: dict) -> str:
    server = "runserver (make dev, reloads on changes)" if DEV else "gunicorn"
    lines = ["", f"Lakeshore Admin is up: {URL}/  ({server})"]
    lines.append(f"  console: {URL}/   Django admin: {URL}/admin/   API: {URL}/api/v1/")
    lines.append(f"  API docs: {URL}/api/docs/")
    lines.append(
        f"  Celery worker and beat: running (reaper every {settings.LAKESHORE_TICK_SECONDS} s)"
    )
    if boot["created"]:
        saved = save_credentials(boot)
        lines.append(f"  admin login: {boot['username']} / {boot['password']}")
        lines.append(f"  API token (operator): {boot['token']}")
        lines.append(f"  (both kept in {saved}, mode 0600: 'make credentials' prints them)")
        lines.append(f"  CLI: {write_cli_config(boot['token'])}")
        lines.append(f"    or: export LAKESHORE_URL={URL} LAKESHORE_TOKEN={boot['token']}")
        lines.append(
            f"  Python SDK: export LAKESHORE_URL={URL} LAKESHORE_CLIENT_TOKEN={boot['token']}"
        )
    else:
        kept = "'make credentials' prints it" if CREDENTIALS.exists() else "shown at first start"
        lines.append(
            f"  admin login: {boot['username']} (password: {kept}; "
            "'make admin-password' sets a new one)"
        )
        lines.append("  API token: 'make token' prints a new operator token")
        lines.append(
            '  Python SDK: eval "$(lakeshore auth env --sdk)"  '
            "(or: export LAKESHORE_URL=… LAKESHORE_CLIENT_TOKEN=…)"
        )
    log = access_log()
    where = (
        "here (LAKESHORE_ACCESS_LOG=-)"
        if log == "-"
        else f"{log} (LAKESHORE_ACCESS_LOG=- shows it here)"
    )
    lines.append(f"  access log: {where}")
    lines.append(f"  lakeshore CLI: {link_cli()}")
    lines.append("Press Ctrl-C to stop.")
    return "\n".join(lines)


def main() -> None:
    if "--supervise" in sys.argv:
        supervisor = Supervisor()
        supervisor.run()
        sys.exit(supervisor.exit_code)
    front()


if __name__ == "__main__":
    main()
