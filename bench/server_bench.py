"""The app server, measured: gunicorn with threads (WSGI, before issue 21), gunicorn with
uvicorn workers (ASGI, what `make run` serves) and granian (ASGI), each serving this
project on this machine. Prints figures, asserts nothing. Run with
`make bench-server` (its own embedded PostgreSQL under var/pg-bench).

    latency   one client, keep-alive: GET a page of jobs, a claim (limit 1), a submit
    parallel  32 clients listing jobs for a few seconds
    burst     240 at once, half of them 15-second claim long-polls, with /healthz
              polled throughout; then 50 ordinary requests right after

The machine is noisy (2 cores shared by the server, PostgreSQL and these clients):
compare the servers within one run, not across machines."""

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

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from accounts.services import token_create  # noqa: E402
from jobs import services  # noqa: E402
from queues import services as queue_services  # noqa: E402

SERVERS = {
    "gunicorn gthread, WSGI (2 × 128 threads: before issue 21)": lambda port: [
        str(BIN / "gunicorn"),
        "-c",
        "python:lakeshore_admin.gunicorn_conf",
        "--worker-class",
        "gthread",
        "--threads",
        "128",
        "--bind",
        f"127.0.0.1:{port}",
        "--access-logfile",
        "/dev/null",
        "lakeshore_admin.wsgi:application",
    ],
    "gunicorn + uvicorn workers, ASGI (make run: parked long-polls)": (
        lambda port: [
            str(BIN / "gunicorn"),
            "-c",
            "python:lakeshore_admin.gunicorn_conf",
            "--bind",
            f"127.0.0.1:{port}",
            "--access-logfile",
            "/dev/null",
        ]
    ),
    "granian, ASGI (2 workers, the same app)": lambda port: [
        str(BIN / "granian"),
        "--interface",
        "asgi",
        "--workers",
        "2",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
        "lakeshore_admin.asgi:application",
    ],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def setup() -> dict:
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE jobs_invocation, fleet_daemon, queues_queueevent, queues_queuesample CASCADE"
        )
        cursor.execute("DELETE FROM queues_queue")
    queue_services.queue_create(name="bench")
    queue_services.queue_create(name="idle")
    for i in range(200):
        services.invocation_submit(function="lakeshore.functions.echo", queue="bench", args=[i])
    _, operator = token_create(username="bench-operator", role="operator")
    _, daemon = token_create(username="bench-daemon", role="daemon")
    connection.close()
    return {"operator": operator, "daemon": daemon}


def start(command: list[str], port: int) -> subprocess.Popen:
    env = {**os.environ, "PORT": str(port)}
    proc = subprocess.Popen(command, cwd=ROOT, env=env)  # noqa: S603
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"{command[0]} did not come up")


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))] * 1000 if values else float("nan")


def latency(base: str, tokens: dict) -> dict:
    headers = {"Authorization": f"Bearer {tokens['operator']}"}
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        for _ in range(20):
            client.get("/api/v1/jobs/", params={"limit": 10})
        took = []
        start = time.perf_counter()
        for _ in range(300):
            t0 = time.perf_counter()
            client.get("/api/v1/jobs/", params={"limit": 10}).raise_for_status()
            took.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
    daemon_headers = {"Authorization": f"Bearer {tokens['daemon']}"}
    with httpx.Client(base_url=base, headers=daemon_headers, timeout=30) as client:
        me = client.post("/api/v1/daemons/register/", json={"name": "lat", "queues": ["idle"]})
        client.headers["Authorization"] = f"Bearer {me.json()['token']}"  # its own credential
        url = f"/api/v1/daemons/{me.json()['id']}/claim/"
        claims = []
        for _ in range(200):
            t0 = time.perf_counter()
            client.post(url, json={"limit": 1}).raise_for_status()
            claims.append(time.perf_counter() - t0)
        client.post(f"/api/v1/daemons/{me.json()['id']}/deregister/")
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        submits = []
        start = time.perf_counter()
        for _ in range(300):
            t0 = time.perf_counter()
            body = {"function": "lakeshore.functions.echo", "queue": "bench"}
            client.post("/api/v1/jobs/", json=body).raise_for_status()
            submits.append(time.perf_counter() - t0)
        submitted = time.perf_counter() - start
    return {
        "list p50 ms": pct(took, 0.5),
        "list p99 ms": pct(took, 0.99),
        "list req/s (1 client)": 300 / elapsed,
        "empty claim p50 ms": pct(claims, 0.5),
        "submit p50 ms": pct(submits, 0.5),
        "submits/s (1 client)": 300 / submitted,
    }


def parallel(base: str, tokens: dict, clients: int = 32, seconds: float = 5.0) -> dict:
    headers = {"Authorization": f"Bearer {tokens['operator']}"}
    took: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run():
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                try:
                    ok = client.get("/api/v1/jobs/", params={"limit": 10}).status_code == 200
                except httpx.HTTPError:
                    ok = False
                with lock:
                    took.append(time.perf_counter() - t0)
                    errors[0] += not ok

    threads = [threading.Thread(target=run) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return {
        f"{clients} clients req/s": len(took) / elapsed,
        f"{clients} clients p50 ms": pct(took, 0.5),
        f"{clients} clients p99 ms": pct(took, 0.99),
        f"{clients} clients errors": errors[0],
    }


def burst(base: str, tokens: dict, total: int = 240, wait: float = 15.0) -> dict:
    """Half long-polls, half lists, all at once; /healthz polled throughout."""
    operator = {"Authorization": f"Bearer {tokens['operator']}"}
    daemon = {"Authorization": f"Bearer {tokens['daemon']}"}
    with httpx.Client(base_url=base, headers=daemon, timeout=60) as client:
        registered = [
            client.post(
                "/api/v1/daemons/register/", json={"name": f"b{i}", "queues": ["idle"]}
            ).json()
            for i in range(total // 2)
        ]
    ids = [r["id"] for r in registered]
    own = [{"Authorization": f"Bearer {r['token']}"} for r in registered]
    statuses: list[int] = []
    took: list[float] = []
    polls: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(total)

    def request(kind: str, i: int):
        headers = own[i] if kind == "claim" else operator
        with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
            barrier.wait()
            t0 = time.perf_counter()
            try:
                if kind == "claim":
                    code = client.post(
                        f"/api/v1/daemons/{ids[i]}/claim/", json={"limit": 1, "wait": wait}
                    ).status_code
                else:
                    code = client.get("/api/v1/jobs/", params={"limit": 50}).status_code
            except httpx.HTTPError:
                code = 599
            with lock:
                statuses.append(code)
                (took if kind == "list" else polls).append(time.perf_counter() - t0)

    health: list[tuple[int, float]] = []
    done = threading.Event()

    def poll_health():
        with httpx.Client(base_url=base, timeout=10) as client:
            while not done.is_set():
                t0 = time.perf_counter()
                try:
                    code = client.get("/healthz").status_code
                except httpx.HTTPError:
                    code = 599
                health.append((code, time.perf_counter() - t0))
                done.wait(0.25)

    threads = [threading.Thread(target=request, args=("claim", i)) for i in range(total // 2)]
    threads += [threading.Thread(target=request, args=("list", i)) for i in range(total // 2)]
    poller = threading.Thread(target=poll_health)
    poller.start()
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    done.set()
    poller.join()
    after = []
    with httpx.Client(base_url=base, headers=operator, timeout=30) as client:
        for _ in range(50):
            try:
                after.append(client.get("/api/v1/jobs/", params={"limit": 10}).status_code)
            except httpx.HTTPError:
                after.append(599)
    return {
        "burst 5xx/failed": sum(1 for s in statuses if s >= 500),
        "burst lists p50 ms": pct(took, 0.5),
        "burst lists p99 ms": pct(took, 0.99),
        "burst long-polls p50 s": pct(polls, 0.5) / 1000,
        "burst long-polls max s": max(polls, default=0),
        "burst wall s": elapsed,
        "healthz non-200 during burst": sum(1 for code, _ in health if code != 200),
        "healthz max ms during burst": max((t for _, t in health), default=0) * 1000,
        "after burst: non-200 of 50": sum(1 for s in after if s != 200),
    }


def main() -> None:
    tokens = setup()
    results: dict[str, dict] = {}
    for name, command in SERVERS.items():
        port = free_port()
        proc = start(command(port), port)
        base = f"http://127.0.0.1:{port}"
        try:
            figures = {}
            figures.update(latency(base, tokens))
            figures.update(parallel(base, tokens))
            figures.update(burst(base, tokens))
            results[name] = figures
        finally:
            proc.terminate()
            proc.wait(30)
        print(f"done: {name}", flush=True)
    names = list(results)
    rows = list(results[names[0]])
    width = max(len(r) for r in rows)
    print("\n" + " " * width + " | " + " | ".join(names))
    for row in rows:
        cells = []
        for name in names:
            value = results[name].get(row)
            cells.append(f"{value:,.1f}" if isinstance(value, float) else str(value))
        print(
            f"{row:<{width}} | "
            + " | ".join(f"{c:>{len(n)}}" for c, n in zip(cells, names, strict=True))
        )
    print("\n2 cores shared by server, PostgreSQL and clients: compare within this run.")


if __name__ == "__main__":
    main()
