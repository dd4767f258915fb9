"""API clients holding a fresh token of a role, for the tests of every area that call the
REST API. A pytest plugin: tests/conftest.py registers it (tests/jobs/conftest.py has an
`operator` of its own)."""

import pytest
from rest_framework.test import APIClient

from tests.support import builders


@pytest.fixture
def operator():
    """An APIClient authenticated with a fresh operator token."""
    client = APIClient()
    client.credentials(**builders.auth(builders.token("operator")))
    return client


@pytest.fixture
def viewer():
    """An APIClient authenticated with a fresh viewer token."""
    client = APIClient()
    client.credentials(**builders.auth(builders.token("viewer")))
    return client
