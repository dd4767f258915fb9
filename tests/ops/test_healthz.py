import pytest
from django.db.backends.utils import CursorWrapper
from django.db.utils import OperationalError

pytestmark = pytest.mark.django_db


def test_it_answers_ok_when_the_database_answers(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_it_answers_ok_when_the_database_does_not(client, monkeypatch):
    """Liveness only: a database outage is /readyz's business (tests/ops/test_readyz.py)."""

    def broken(self, sql, params=None):
        raise OperationalError("connection refused")

    monkeypatch.setattr(CursorWrapper, "execute", broken)
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
