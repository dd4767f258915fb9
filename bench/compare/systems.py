"""The three systems compared, each on a database of its own on the same PostgreSQL
server (var/pg-bench):

    Lakeshore      this project, over HTTP: gunicorn with lakeshore_admin.gunicorn_conf
                   (the production config), database `lakeshore_bench`
    raw SQL        the floor: one table, one partial index, plain statements over psycopg
                   (autocommit), database `raw_bench`
    procrastinate  procrastinate 3.10 in var/bench-venv, driven by procrastinate_driver.py
                   in that venv, database `procrastinate_bench`, a sync no-op task

Each class knows how to set its system up, empty it, fill it, and talk to it; what is
measured lives in rows.py."""

import json
import os
import re
import signal
import subprocess
import time

import httpx
import psutil
import psycopg

from bench.compare.infra import (
    BIN,
    ROOT,
    RUN_DIR,
    Postgres,
    bench_venv_python,
    free_port,
    tree_cpu_seconds,
)
from bench.compare.lines import LineClient

RUNNER = "lakeshore.runner"  # a pool's job process
TEMPLATE = "lakeshore.pool.forkserver"  # process isolation's job template
READY_WITHIN = 60.0  # seconds for a daemon to be ready for work
IDLE_LOOK = 0.2  # seconds between two looks at the daemon's process tree
IDLE_CPU = 0.01  # CPU seconds it may spend between two looks and be idle

NOOP = "lakeshore.functions.echo"  # the cheapest function a daemon runs
PRINTER = ("lakeshore.functions.count", [100, 0])  # 100 lines, at once: a chatty job


def stop_gunicorn(server: subprocess.Popen) -> None:
    """SIGTERM, gunicorn's graceful stop: the app ends its parked waits at once and the
    workers exit within a second or two. Its quick stop (SIGINT) sends the workers
    SIGQUIT, on which they wait out graceful_timeout (25 s) before the arbiter kills
    them."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)


class Lakeshore:
    name = "Lakeshore"
    database = "lakeshore_bench"
    queues = ("bench", "cc", "e2e", "idle", "cancel")

    def __init__(self, pg: Postgres):
        self.pg = pg
        self.env = {
            **os.environ,
            "DATABASE_URL": pg.url(self.database),
            "LAKESHORE_VAR_DIR": str(RUN_DIR),
            "DJANGO_SETTINGS_MODULE": "lakeshore_admin.settings",
            "XDG_CONFIG_HOME": str(RUN_DIR / "config"),  # never the user's auth.yml
            # One bootstrap token registers each whole fleet (5,000 daemons and more), as
            # the owner of such a fleet would allow (README "Limits").
            "LAKESHORE_DAEMONS_PER_TOKEN": "100000",
        }
        self.logs = RUN_DIR / "log"
        self.server: subprocess.Popen | None = None
        self.base_url = ""
        self.tokens: dict[str, str] = {}
        self.db: psycopg.Connection | None = None
        self.isolation_modes: list[str] = []

    # ------------------------------------------------------------------ lifecycle

    def setup(self) -> None:
        self.setup_database()
        for role in ("operator", "daemon"):
            self.tokens[role] = self.manage(
                "create_token", "--user", f"bench-{role}", "--role", role, "--name", "bench"
            ).strip()
        self.isolation_modes = self._isolation_modes()
        self.start_server()
        with self.client() as client:
            for name in self.queues:
                answer = client.post("/api/v1/queues/", json={"name": name})
                if answer.status_code not in (201, 409):
                    answer.raise_for_status()

    def setup_database(self) -> None:
        """The database, migrated and emptied (all the in-process rows need)."""
        self.pg.create(self.database, fresh=False)
        for folder in (self.logs, RUN_DIR / "static", RUN_DIR / "config"):
            folder.mkdir(parents=True, exist_ok=True)
        self.manage("migrate", "--verbosity", "0")
        self.db = self.pg.connect(self.database)
        self.reset()

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [str(BIN / "python"), "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise RuntimeError(f"manage.py {args[0]} failed: {done.stderr.strip()[-2000:]}")
        return done.stdout

    def start_server(self) -> None:
        self.server, self.base_url = self.serve()

    def serve(
        self, app: str | None = None, *, settings: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen, str]:
        """gunicorn with Lakeshore's configuration, serving Lakeshore or `app` (an ASGI
        app's dotted path: the floor reference, bench/compare/floor_app.py), with
        `settings` added to its environment; it and its base URL once it answers."""
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        env = {**self.env, **(settings or {}), "PORT": str(port), "LAKESHORE_BIND": "127.0.0.1"}
        command = [str(BIN / "gunicorn"), "-c", "python:lakeshore_admin.gunicorn_conf"]
        command += ["--access-logfile", os.environ.get("BENCH_ACCESS_LOG", "/dev/null")]
        name = "gunicorn-floor.log" if app else "gunicorn-b.log" if settings else "gunicorn.log"
        with open(self.logs / name, "wb") as log:  # this run's
            server = subprocess.Popen(
                [*command, *([app] if app else [])],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        probe = "/healthz" if app is None else "/hello"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise RuntimeError(f"gunicorn exited; see {self.logs / name}")
            try:
                if httpx.get(f"{base_url}{probe}", timeout=2).status_code == 200:
                    return server, base_url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        server.kill()
        server.wait(5)
        raise RuntimeError(f"gunicorn did not answer {probe} within 60 s")

    def stop_server(self) -> None:
        if self.server is not None:
            stop_gunicorn(self.server)
        self.server = None

    def close(self) -> None:
        self.stop_server()
        if self.db is not None:
            self.db.close()

    # ------------------------------------------------------------------ data

    def sql(self, query: str, params=None) -> list[tuple]:
        cursor = self.db.execute(query, params)
        return cursor.fetchall() if cursor.description else []

    def reset(self) -> None:
        self.sql(
            "TRUNCATE jobs_invocation, fleet_daemon, queues_queueevent, queues_queuesample, "
            "jobs_joblog, jobs_logchunk CASCADE"
        )

    def fill(
        self,
        queue: str,
        n: int,
        *,
        state: str = "queued",
        analyze: bool = True,
        function: str = NOOP,
        args: list | None = None,
    ) -> None:
        """n invocations of `function` (the no-op by default, its args [i]), written by
        SQL (like queue_bench.fill)."""
        self.sql(
            """INSERT INTO jobs_invocation (queue, function, args, kwargs, priority, state,
                   attempts, max_attempts, key, reason, error, created_at, finished_at)
               SELECT %(queue)s, %(function)s,
                      COALESCE(%(args)s::jsonb, jsonb_build_array(g)), '{}', 0, %(state)s::text,
                      0, 1, '', '', '', now(),
                      CASE WHEN %(state)s::text = 'queued' THEN NULL ELSE now() END
                 FROM generate_series(1, %(n)s) g""",
            {
                "queue": queue,
                "function": function,
                "args": None if args is None else json.dumps(args),
                "state": state,
                "n": n,
            },
        )
        if analyze:
            self.sql("VACUUM ANALYZE jobs_invocation")

    def count(self, queue: str, state: str) -> int:
        query = "SELECT count(*) FROM jobs_invocation WHERE queue = %s AND state = %s"
        return self.sql(query, [queue, state])[0][0]

    # ------------------------------------------------------------------ HTTP

    def client(self, role: str = "operator", **kwargs) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[role]}"}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=120, **kwargs)

    def async_client(self, role: str = "daemon", **kwargs) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.tokens[role]}"}
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=120, **kwargs)

    @staticmethod
    def register(client: httpx.Client, name: str, queue: str) -> str:
        """Register a daemon, then let the client speak with its own credential (as
        `lakeshore daemon run` does)."""
        answer = client.post("/api/v1/daemons/register/", json={"name": name, "queues": [queue]})
        answer.raise_for_status()
        client.headers["Authorization"] = f"Bearer {answer.json()['token']}"
        return answer.json()["id"]

    def probes(self, name: str = "django-probes") -> LineClient:
        """bench/compare/django_probes.py in a process of its own, with this server's
        environment (its database), logging to `name`.log."""
        return LineClient(
            [str(BIN / "python"), "-m", "bench.compare.django_probes"],
            cwd=ROOT,
            env=self.env,
            log=self.logs / f"{name}.log",
        )

    def server_cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.server.pid)

    # ------------------------------------------------------------------ the real daemon

    def _isolation_modes(self) -> list[str]:
        """The choices of `lakeshore daemon run --isolation`, or [] without the flag."""
        done = subprocess.run(
            [str(BIN / "lakeshore"), "daemon", "run", "--help"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if "--isolation" not in done.stdout:
            return []
        found = re.search(r"--isolation\s+\[([\w|-]+)\]", done.stdout)
        return found.group(1).split("|") if found else ["pool", "process"]

    def start_daemon(self, *, queue: str, concurrency: int, isolation: str | None, name: str):
        command = [str(BIN / "lakeshore"), "daemon", "run", "--queues", queue]
        command += ["--concurrency", str(concurrency), "--name", name]
        command += os.environ.get("BENCH_DAEMON_FLAGS", "").split()
        if isolation:
            command += ["--isolation", isolation]
        env = {**self.env, "LAKESHORE_URL": self.base_url, "LAKESHORE_TOKEN": self.tokens["daemon"]}
        for secret in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE"):
            env.pop(secret, None)  # a daemon host knows only the URL and its token
        with open(self.logs / f"{name}.log", "wb") as log:  # its last run's
            return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_registered(self, name: str, process: subprocess.Popen, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sql("SELECT 1 FROM fleet_daemon WHERE name = %s", [name]):
                return
            if process.poll() is not None:
                raise RuntimeError(f"daemon {name} exited; see {self.logs / (name + '.log')}")
            time.sleep(0.05)
        raise RuntimeError(f"daemon {name} did not register within {timeout:.0f} s")

    def wait_ready(
        self, name: str, process: subprocess.Popen, *, concurrency: int, isolation: str | None
    ) -> None:
        """Returns once the daemon is ready for work, as a Celery worker says it is
        (worker_ready): registered, its job processes up (pool: one a slot, each a
        runner; process: the job template, its modules imported) and its process tree
        gone idle (it waits in its first claim). Raises past `READY_WITHIN` seconds."""
        self.wait_registered(name, process)
        wanted = (TEMPLATE, 1) if isolation == "process" else (RUNNER, concurrency)
        log = self.logs / f"{name}.log"
        deadline = time.monotonic() + READY_WITHIN
        spent = tree_cpu_seconds(process.pid)
        while time.monotonic() < deadline:
            time.sleep(IDLE_LOOK)
            if process.poll() is not None:
                raise RuntimeError(f"daemon {name} exited; see {log}")
            children = psutil.Process(process.pid).children()
            up = sum(1 for child in children if wanted[0] in " ".join(_cmdline(child)))
            imported = isolation != "process" or "job template" in log.read_text()
            now = tree_cpu_seconds(process.pid)
            if up >= wanted[1] and imported and now - spent < IDLE_CPU:
                return
            spent = now
        raise RuntimeError(f"daemon {name} was not ready within {READY_WITHIN:.0f} s; see {log}")


class RawSQL:
    """The floor: what PostgreSQL itself does for the same work, no framework."""

    name = "raw SQL"
    database = "raw_bench"
    SCHEMA = """
        CREATE TABLE jobs (
            id bigserial PRIMARY KEY,
            queue text NOT NULL,
            payload jsonb NOT NULL,
            state text NOT NULL DEFAULT 'queued',
            attempts integer NOT NULL DEFAULT 0,
            created_at timestamptz NOT NULL DEFAULT now(),
            finished_at timestamptz
        );
        CREATE INDEX jobs_queued ON jobs (queue, id) WHERE state = 'queued';
    """

    def __init__(self, pg: Postgres):
        self.pg = pg
        self.db: psycopg.Connection | None = None

    def setup(self) -> None:
        self.pg.create(self.database, fresh=True)
        self.db = self.connect()
        self.db.execute(self.SCHEMA)

    def connect(self) -> psycopg.Connection:
        return self.pg.connect(self.database)

    def close(self) -> None:
        if self.db is not None:
            self.db.close()

    def reset(self) -> None:
        self.db.execute("TRUNCATE jobs")

    def fill(self, queue: str, n: int, *, state: str = "queued") -> None:
        self.db.execute(
            """INSERT INTO jobs (queue, payload, state)
               SELECT %s, jsonb_build_object('i', g), %s FROM generate_series(1, %s) g""",
            [queue, state, n],
        )
        self.db.execute("VACUUM ANALYZE jobs")


class Procrastinate:
    """procrastinate in its own venv, behind procrastinate_driver.py."""

    name = "procrastinate"
    database = "procrastinate_bench"

    def __init__(self, pg: Postgres):
        self.pg = pg
        self.version = ""
        self.driver: LineClient | None = None

    def setup(self) -> None:
        python, self.version = bench_venv_python()
        self.pg.create(self.database, fresh=True)
        self.driver = LineClient(
            [str(python), "-m", "bench.compare.procrastinate_driver", self.pg.url(self.database)],
            cwd=ROOT,
            env=None,
            log=RUN_DIR / "log" / "procrastinate-driver.log",
        )
        self.driver.call("setup")

    def rate(self, command: str, **arguments) -> float:
        """jobs/s of one driver command (defer_one, batch_defer, worker)."""
        answer = self.driver.call(command, **arguments)
        return answer["count"] / answer["seconds"]

    def reset(self) -> None:
        self.driver.call("reset")

    def close(self) -> None:
        if self.driver is not None:
            self.driver.close()


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # gone meanwhile
        return []
