"""GET /api/v1/sdk/: what the Python SDK needs to reach this server as the caller (read
by `lakeshore auth env --sdk`)."""

import pytest

from tests.support import builders

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "role, roles",
    [
        ("operator", ["daemon", "operator", "viewer"]),
        ("viewer", ["viewer"]),
        ("daemon", ["daemon"]),  # a worker's token may ask too
    ],
)
def test_any_token_reads_the_namespace_its_user_and_its_roles(api, settings, role, roles):
    settings.LAKESHORE_SDK_NAMESPACE = "team-a"
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {builders.token(role, username='ana')}")

    answer = api.get("/api/v1/sdk/")

    assert answer.status_code == 200
    assert answer.json() == {
        "url_path": "/v1/",
        "namespace": "team-a",
        "user": "ana",
        "roles": roles,
    }


def test_without_a_token_it_is_401(api):
    answer = api.get("/api/v1/sdk/")
    assert (answer.status_code, answer.json()["error"]["code"]) == (401, "not_authenticated")


def test_it_costs_at_most_four_statements(api, django_assert_max_num_queries):
    """A query-count bound for the new endpoint: authentication and the roles, no more."""
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {builders.token('operator', username='ana')}")
    with django_assert_max_num_queries(4):
        assert api.get("/api/v1/sdk/").status_code == 200
