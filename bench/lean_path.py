"""What the lean path (edge/lean_path.py) saves: the server's CPU per request
for the daemon protocol's hot requests and a submit, through the real WSGI application,
three ways:

    lean       LeanPath in front of Django (what wsgi.py serves)
    django     Django alone: settings.MIDDLEWARE, URL resolving, DRF's dispatch
    narrowed   Django alone with only the middleware an API answer needs to be the
               same (security headers, CSP, header limits, clickjacking, Vary, audit):
               what ordering or narrowing the middleware could win at best

Each figure is the calling thread's CPU time (time.thread_time) per request, so the
database's own work and other processes on the machine do not count; the median of
the rounds, the variants taken in turn. Prints figures, asserts nothing. Run with
`.venv/bin/python bench/lean_path.py` (its own embedded PostgreSQL under var/pg-bench).
"""

import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
if not os.environ.get("DATABASE_URL"):
    os.environ.setdefault("LAKESHORE_PGDATA", str(ROOT / "var" / "pg-bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from accounts.services import token_create  # noqa: E402
from edge.lean_path import LeanPath  # noqa: E402
from queues import services as queue_services  # noqa: E402

ECHO = "lakeshore.functions.echo"
QUEUE = "lean-bench"
N = int(os.environ.get("LEAN_BENCH_N", "400"))
ROUNDS = int(os.environ.get("LEAN_BENCH_ROUNDS", "3"))
NARROWED = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "lakeshore_admin.middleware.RequestHeaderLimitMiddleware",
    "lakeshore_admin.middleware.HtmxLoginRedirectMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "accounts.audit.AuditMiddleware",
]


def call(app, path, body, token):
    raw = json.dumps(body).encode()
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "HTTP_HOST": "127.0.0.1",
        "REMOTE_ADDR": "127.0.0.1",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(raw),
        "wsgi.errors": sys.stderr,
        "CONTENT_LENGTH": str(len(raw)),
        "CONTENT_TYPE": "application/json",
        "HTTP_AUTHORIZATION": f"Bearer {token}",
    }
    got = {}

    def start_response(status, headers, exc_info=None):
        got["status"] = int(status.split()[0])

    result = app(environ, start_response)
    body = b"".join(result)
    if hasattr(result, "close"):
        result.close()
    if got["status"] >= 300:
        raise SystemExit(f"{path}: {got['status']} {body[:300]!r}")
    return json.loads(body)


def setup():
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM jobs_invocation WHERE queue = %s", [QUEUE])
        cursor.execute("DELETE FROM fleet_daemon WHERE %s = ANY(queues)", [QUEUE])
    if not queue_services.Queue.objects.filter(name=QUEUE).exists():
        queue_services.queue_create(name=QUEUE)
    _, operator = token_create(username="lean-bench-operator", role="operator")
    _, bootstrap = token_create(username="lean-bench-daemon", role="daemon")
    connection.close()
    return operator, bootstrap


def apps():
    lean = LeanPath(WSGIHandler())
    full = WSGIHandler()
    with override_settings(MIDDLEWARE=NARROWED):
        narrowed = WSGIHandler()
    return {"lean": lean, "django": full, "narrowed": narrowed}


def timed(run, n):
    started = time.thread_time()
    for i in range(n):
        run(i)
    return (time.thread_time() - started) / n * 1000


def measure(app, operator, bootstrap) -> dict:
    me = call(
        WSGIHandler(), "/api/v1/daemons/register/", {"name": "lb", "queues": [QUEUE]}, bootstrap
    )
    daemon, token = me["id"], me["token"]
    base = f"/api/v1/daemons/{daemon}"
    figures = {}
    figures["submit one"] = timed(
        lambda i: call(
            app, "/api/v1/jobs/", {"function": ECHO, "queue": QUEUE, "args": [i]}, operator
        ),
        N,
    )
    figures["heartbeat"] = timed(lambda i: call(app, f"{base}/heartbeat/", {"held": []}, token), N)
    held = []

    def exchange(i):
        outcomes = [
            {
                "invocation": int(c["id"]),
                "attempt": c["attempts"],
                "state": "succeeded",
                "result": None,
            }
            for c in held
        ]
        answer = call(app, f"{base}/exchange/", {"outcomes": outcomes, "limit": 1}, token)
        held[:] = answer["claimed"]

    figures["exchange (report one, claim one)"] = timed(exchange, N)
    if held:
        exchange(0)  # report the last one
    figures["empty claim"] = timed(lambda i: call(app, f"{base}/claim/", {"limit": 1}, token), N)
    call(WSGIHandler(), f"{base}/deregister/", {}, token)
    return figures


def main():
    operator, bootstrap = setup()
    variants = apps()
    print(f"# lean path: server CPU per request (ms), {N} requests a row, {ROUNDS} rounds")
    print(f"  LAKESHORE_LEAN_PATH={settings.LAKESHORE_LEAN_PATH}, Python {sys.version.split()[0]}")
    rounds: dict = {}
    names = list(variants)
    for r in range(ROUNDS):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            for row, ms in measure(variants[name], operator, bootstrap).items():
                rounds.setdefault(row, {}).setdefault(name, []).append(ms)
            connection.close()
    header = f"{'':38}" + "".join(f"{n:>10}" for n in names) + "   django÷lean  narrowed÷lean"
    print(header)
    for row, by in rounds.items():
        med = {n: statistics.median(by[n]) for n in names}
        print(
            f"{row:38}"
            + "".join(f"{med[n]:10.3f}" for n in names)
            + f"   {med['django'] / med['lean']:10.2f}×  {med['narrowed'] / med['lean']:12.2f}×"
        )
    for row, by in rounds.items():
        print(
            f"  {row}: " + "; ".join(f"{n} " + ", ".join(f"{v:.3f}" for v in by[n]) for n in names)
        )


if __name__ == "__main__":
    main()
