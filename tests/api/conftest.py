import pytest
from rest_framework.test import APIClient

from tests import builders


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
