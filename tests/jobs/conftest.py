import pytest
from rest_framework.test import APIClient

from tests.support import builders


@pytest.fixture
def operator():
    client = APIClient(SERVER_NAME="localhost")
    client.credentials(**builders.auth(builders.token("operator")))
    return client


@pytest.fixture
def daemon_client():
    """A client with a daemon-role token, and a helper to register a daemon with it."""
    client = APIClient(SERVER_NAME="localhost")
    client.credentials(**builders.auth(builders.token("daemon")))
    return client
