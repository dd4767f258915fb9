"""/readyz: 200 when the database answers, 503 when not, and never a word about why
(no exception text, socket path or host) to an anonymous caller."""

from pathlib import Path

import pytest
from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.db.utils import OperationalError

pytestmark = pytest.mark.django_db


def test_it_answers_ready_when_the_database_answers(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready"}
    assert "no-cache" in response["Cache-Control"]


def test_it_needs_no_login(client):
    assert client.get("/readyz").status_code == 200
    assert client.head("/readyz").status_code == 200


def test_it_answers_503_and_nothing_more_when_a_query_fails(client, monkeypatch):
    secret = f'connection to server on socket "{connection.settings_dict.get("HOST")}" failed'

    def broken(self, sql, params=None):
        raise OperationalError(secret)

    monkeypatch.setattr(CursorWrapper, "execute", broken)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "checks": {"database": "unavailable"}}


def test_it_answers_503_when_no_connection_can_be_made(client, monkeypatch):
    """The realistic outage: the server is gone, so connecting fails (the message would
    name the socket path or host)."""

    def refuse(*args, **kwargs):
        raise OperationalError(f"could not connect to {connection.settings_dict.get('HOST')}")

    monkeypatch.setattr(connection, "ensure_connection", refuse)
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.content.decode()
    assert body == '{"status": "unavailable", "checks": {"database": "unavailable"}}'
    host = str(connection.settings_dict.get("HOST") or "")
    assert host == "" or host not in body


def test_healthz_stays_up_while_readyz_is_not(client, monkeypatch):
    def refuse(*args, **kwargs):
        raise OperationalError("down")

    monkeypatch.setattr(connection, "ensure_connection", refuse)
    assert client.get("/readyz").status_code == 503
    assert client.get("/healthz").json() == {"status": "ok"}


def test_make_run_waits_for_readiness_not_liveness():
    run = (Path(__file__).resolve().parents[2] / "scripts" / "run.py").read_text()
    wait = run[run.index("def wait_healthy") :].split("\ndef ", 1)[0]
    assert "/readyz" in wait and "/healthz" not in wait
