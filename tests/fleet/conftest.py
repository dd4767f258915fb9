import pytest
from rest_framework.test import APIClient

from tests.support import builders


@pytest.fixture
def operator_client():
    client = APIClient(SERVER_NAME="localhost")
    client.credentials(**builders.auth(builders.token("operator")))
    return client
