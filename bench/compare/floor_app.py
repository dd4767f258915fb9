"""The floor under the "submit one at a time over HTTP" row: what the same HTTP server
and client cost before any of Lakeshore's own work. `make bench` serves this WSGI app
under the same gunicorn configuration as Lakeshore (uvicorn workers) and sends it the same
requests; like Lakeshore's submit it runs on a2wsgi's pool of LAKESHORE_WEB_THREADS threads
(edge/application.py), as `application`:

    POST /hello    answers {} (a hello world: the HTTP round trip alone)
    POST /insert   runs the submit's own INSERT (jobs/transitions/submit.py, read from its
                   source: the same text, prepared, committed durably) and answers the
                   new row as JSON (its 20 columns); without the two columns saying
                   whether the queue is served (jobs/serving.py builds them with Django)

No Django: no token, no validation, no rules beyond the statement's, no model, no
serializer, no middleware, and one connection per thread instead of a pool. What
Lakeshore's submit costs above /insert is its own request path."""

import ast
import json
import os
import threading
from pathlib import Path

import django
import psycopg
from a2wsgi import WSGIMiddleware

ROOT = Path(__file__).resolve().parents[2]

# The server's own HTTP protocol (edge/http_protocol.py, which gunicorn_conf
# names) renders a late body's 408 as the site renders its errors, so a worker needs
# Django set up before it loads it: done once as the app loads, never per request.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")
django.setup()


def _statement() -> str:
    tree = ast.parse((ROOT / "jobs" / "transitions" / "submit.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(target, "id", None) == "_INSERT_ADMITTED_SQL" for target in node.targets
        ):
            value = node.value
            if isinstance(value, ast.BinOp):  # "…RETURNING *, " + serving.columns(…)
                return ast.literal_eval(value.left).rstrip().rstrip(",")
            return ast.literal_eval(value)
    raise RuntimeError("jobs/transitions/submit.py has no _INSERT_ADMITTED_SQL")


SQL = _statement()
_local = threading.local()


def _connection() -> psycopg.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True, prepare_threshold=0)
        _local.conn = conn
    return conn


def app(environ, start_response):
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    if environ.get("PATH_INFO") == "/hello":
        answer, status = b"{}", "200 OK"
    else:
        data = json.loads(body)
        params = {
            "queue": data["queue"],
            "function": data["function"],
            "args": json.dumps(data.get("args", [])),
            "kwargs": "{}",
            "priority": 0,
            "queued": "queued",
            "max_attempts": 1,
            "timeout_s": None,
            "key": "",
            "wire": "",
            "args_blob": None,
            "run_config": "{}",
            "admitting": ["active", "paused"],
        }
        cursor = _connection().execute(SQL, params, prepare=True)
        names = [column.name for column in cursor.description]
        answer = json.dumps(dict(zip(names, cursor.fetchone(), strict=True)), default=str)
        answer, status = answer.encode(), "201 Created"
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(answer)))]
    start_response(status, headers)
    return [answer]


# What the server serves: the WSGI app above as edge/application.py serves Lakeshore's
# submit (a2wsgi, one pool of threads a process, as many as Lakeshore's).
application = WSGIMiddleware(app, workers=int(os.environ.get("LAKESHORE_WEB_THREADS", "128")))
