"""Long-polls against `make run`'s server (issue 17, "Admit long-polls"). Prints figures,
asserts nothing. Run with `.venv/bin/python bench/longpoll.py` (its own embedded
PostgreSQL under var/pg-bench, or DATABASE_URL).

gunicorn with lakeshore_admin/gunicorn_conf.py (what `make run` serves), against a
real PostgreSQL, while 600 daemons long-poll it as `lakeshore daemon run` does when idle
(claim with `wait` 5 s back to back; on Retry-After, wait that long plus up to as long
again at random; a heartbeat every 10 s on a connection of its own; each registers
itself over the first 10 s, as a fleet coming up does). They run in a
process of their own (asyncio + httpx); in this one, the probes:

    heartbeat   another daemon's heartbeat, every second
    healthz     GET /healthz, every second
    console     a logged-in GET / (the queue list), every second

and the reaper runs every LAKESHORE_TICK_SECONDS, as `make run`'s Celery beat does.

Twice: with the default LAKESHORE_MAX_WAITS (96 a process: jobs/waits.py), then the
negative control with LAKESHORE_MAX_WAITS=100000 (every long-poll sleeps, as before).
Written for issue 17's threaded server (2 processes × 128 threads). Since issue 21 that
configuration serves the ASGI app (uvicorn workers): the daemons' claims park on the
event loop, bounded by LAKESHORE_MAX_PARKED, not LAKESHORE_MAX_WAITS, so the two runs
now differ only in the waits that still take a thread; `python -m bench.compare fleet`
measures idle fleets against this server.

The machine is noisy (2 cores shared by the server, PostgreSQL and these clients):
compare the two runs, not machines."""

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
if not os.environ.get("DATABASE_URL"):
    os.environ.setdefault("LAKESHORE_PGDATA", str(ROOT / "var" / "pg-bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")
BIN = Path(sys.executable).parent

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

from accounts.services import token_create  # noqa: E402
from bench.longpoll_swarm import RAMP, TIMEOUT  # noqa: E402
from fleet.models import Daemon, DaemonState  # noqa: E402
from queues import services as queue_services  # noqa: E402

QUEUE = "idle"
EVERY = 0.5  # seconds between a probe's requests
WARM = RAMP + 5  # the figures count from here: every daemon polls by then
HUGE = 100_000  # the negative control's LAKESHORE_MAX_WAITS: no admission


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))] if values else float("nan")


# ---------------------------------------------------------------------------- one run


def setup():
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_invocation, fleet_daemon, queues_queueevent CASCADE")
        cursor.execute("DELETE FROM queues_queue")
    queue_services.queue_create(name=QUEUE)
    _, daemon = token_create(username="longpoll-daemons", role="daemon")
    _, _operator = token_create(username="longpoll-console", role="operator")
    console = Client()
    console.force_login(
        get_user_model().objects.get(username="longpoll-console"),
        backend="django.contrib.auth.backends.ModelBackend",
    )
    session = console.cookies["sessionid"].value
    connection.close()
    return daemon, session


def register(base: str, bootstrap: str, count: int, name: str) -> list[tuple[str, str]]:
    """(id, the token that acts for it): its own credential if the server gives one."""
    made = []
    with httpx.Client(base_url=base, timeout=TIMEOUT) as client:
        for i in range(count):
            answer = client.post(
                "/api/v1/daemons/register/",
                json={"name": f"{name}-{i}", "queues": [QUEUE]},
                headers={"Authorization": f"Bearer {bootstrap}"},
            )
            answer.raise_for_status()
            body = answer.json()
            made.append((str(body["id"]), body.get("token") or bootstrap))
    return made


def start_server(port: int, max_waits: int | None, log) -> subprocess.Popen:
    env = {**os.environ, "PORT": str(port), "LAKESHORE_BIND": "127.0.0.1"}
    env.pop("LAKESHORE_MAX_WAITS", None)
    if max_waits is not None:
        env["LAKESHORE_MAX_WAITS"] = str(max_waits)
    command = [str(BIN / "gunicorn"), "-c", "python:lakeshore_admin.gunicorn_conf"]
    command += ["--access-logfile", "/dev/null"]  # 600 daemons: no line a request
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("gunicorn did not come up")


def probe(name: str, call, stop: threading.Event, took: dict) -> threading.Thread:
    """Calls every EVERY s; took[name] gets (when, seconds), TIMEOUT for a failure."""

    def run():
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                ok = call().status_code == 200
            except httpx.HTTPError:
                ok = False
            spent = time.monotonic() - t0
            took[name].append((t0, spent if ok else TIMEOUT))
            stop.wait(max(0.0, EVERY - spent))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def reaper(stop: threading.Event, every: float) -> threading.Thread:
    """The reaper every tick, in a long-lived process as make run's Celery worker runs
    it (starting `manage.py reap` anew each tick would cost the 2 cores a Django start,
    1-2 s of CPU, every 10 s: a load make run does not have)."""
    code = (
        "import django, time, sys; django.setup(); from django.db import connection; "
        "from jobs.services import reap\n"
        f"while True:\n    time.sleep({every}); reap(); connection.close()"
    )

    def run():
        process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)  # noqa: S603
        stop.wait()
        process.terminate()
        process.wait(10)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def one_run(label: str, max_waits, *, daemons: int, seconds: float, wait: float) -> dict:
    bootstrap, session = setup()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(ROOT / "var" / f"longpoll-{label}.log", "w")  # noqa: SIM115 - closed below
    server = start_server(port, max_waits, log)
    try:
        ((probe_id, probe_token),) = register(base, bootstrap, 1, "probe")
        process = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "bench.longpoll_swarm"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        plan = {
            "base": base,
            "token": bootstrap,
            "daemons": daemons,
            "seconds": seconds,
            "wait": wait,
        }
        process.stdin.write(json.dumps(plan))
        process.stdin.close()
        stop = threading.Event()
        started = time.monotonic()
        took: dict[str, list[float]] = {"heartbeat": [], "healthz": [], "console": []}
        beat = httpx.Client(base_url=base, timeout=TIMEOUT)
        health = httpx.Client(base_url=base, timeout=TIMEOUT)
        console = httpx.Client(base_url=base, timeout=TIMEOUT, cookies={"sessionid": session})
        threads = [
            probe(
                "heartbeat",
                lambda: beat.post(
                    f"/api/v1/daemons/{probe_id}/heartbeat/",
                    json={},
                    headers={"Authorization": f"Bearer {probe_token}"},
                ),
                stop,
                took,
            ),
            probe("healthz", lambda: health.get("/healthz"), stop, took),
            probe("console", lambda: console.get("/"), stop, took),
            reaper(stop, float(settings.LAKESHORE_TICK_SECONDS)),
        ]
        counts = json.loads(process.stdout.read())
        process.wait(30)
        stop.set()
        for thread in threads:
            thread.join(TIMEOUT + 5)
        lost = Daemon.objects.filter(state=DaemonState.LOST).count()
        connection.close()
    finally:
        server.terminate()
        try:
            server.wait(40)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    row = {}
    for name in ("heartbeat", "healthz", "console"):
        values = [spent for at, spent in took[name] if at - started >= WARM]
        everything = [spent for _, spent in took[name]]
        row[f"{name} p50 ms"] = pct(values, 0.5) * 1000
        row[f"{name} p99 ms"] = pct(values, 0.99) * 1000
        row[f"{name} max ms (ramp too)"] = max(everything, default=float("nan")) * 1000
        row[f"{name} failed or ≥ {TIMEOUT:.0f} s"] = sum(1 for v in everything if v >= TIMEOUT)
    row["swarm heartbeat p99 ms"] = pct(counts["heartbeats"], 0.99) * 1000
    row["daemons marked lost"] = lost
    row["swarm claims answered"] = counts["claims"]
    row["waits refused (Retry-After)"] = counts["refused"]
    row["swarm requests failed"] = counts["errors"]
    kinds = sorted(counts["kinds"].items(), key=lambda kv: -kv[1])
    row["  of which"] = ", ".join(f"{k} {n}" for k, n in kinds[:2]) or "-"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--daemons", type=int, default=600)
    parser.add_argument("--seconds", type=float, default=75.0)
    parser.add_argument("--wait", type=float, default=5.0, help="each claim's wait (s)")
    parser.add_argument("--only", choices=["admitted", "control"], default=None)
    args = parser.parse_args()
    runs = {
        "admitted": None,  # the default LAKESHORE_MAX_WAITS
        "control": HUGE,
    }
    if args.only:
        runs = {args.only: runs[args.only]}
    results = {}
    for label, max_waits in runs.items():
        results[label] = one_run(
            label, max_waits, daemons=args.daemons, seconds=args.seconds, wait=args.wait
        )
        print(f"done: {label}", flush=True)
    names = {
        "admitted": "default MAX_WAITS",
        "control": f"MAX_WAITS={HUGE} (control)",
    }
    rows = list(next(iter(results.values())))
    width = max(len(r) for r in rows)
    header = [names[label] for label in results]
    print(
        f"\n{args.daemons} daemons long-polling (wait {args.wait:g} s) for {args.seconds:g} s,"
        f" started over {RAMP:g} s; p50/p99 from {WARM:g} s on, a probe every {EVERY:g} s"
    )
    print(" " * width + " | " + " | ".join(header))
    for row in rows:
        cells = []
        for label in results:
            value = results[label][row]
            cells.append(f"{value:,.0f}" if isinstance(value, float) else str(value))
        print(
            f"{row:<{width}} | "
            + " | ".join(f"{c:>{len(h)}}" for c, h in zip(cells, header, strict=True))
        )
    print("\n2 cores shared by server, PostgreSQL and clients: compare within this run.")


if __name__ == "__main__":
    main()
