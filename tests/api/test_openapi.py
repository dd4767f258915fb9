"""GET /api/schema/ and /api/docs/: the OpenAPI description of the API."""

import json
import re

import pytest
from django.urls import URLPattern
from drf_spectacular.validation import validate_schema

from accounts.api import urls as account_urls
from fleet.api import urls as fleet_urls
from queues.api import urls as queue_urls

pytestmark = pytest.mark.django_db

ERROR_REF = "#/components/schemas/Error"
METHODS = {
    "/api/v1/apply/": {"post"},
    "/api/v1/export/": {"get"},
    "/api/v1/queues/": {"get", "post"},
    "/api/v1/queues/{name}/": {"get", "patch", "delete"},
    "/api/v1/queues/{name}/events/": {"get"},
    "/api/v1/queues/{name}/stats/": {"get"},
    "/api/v1/stats/": {"get"},
    "/api/v1/queues/{name}/drain/": {"post"},
    "/api/v1/queues/{name}/pause/": {"post"},
    "/api/v1/queues/{name}/resume/": {"post"},
    "/api/v1/queues/{name}/archive/": {"post"},
    "/api/v1/queues/{name}/unarchive/": {"post"},
    "/api/v1/providers/": {"get", "post"},
    "/api/v1/providers/{name}/": {"get", "patch", "delete"},
    "/api/v1/daemons/": {"get"},
    "/api/v1/daemons/register/": {"post"},
    "/api/v1/daemons/{daemon_id}/": {"get"},
    "/api/v1/tokens/": {"get", "post"},
    "/api/v1/tokens/{token_id}/revoke/": {"post"},
}


@pytest.fixture
def schema(operator) -> dict:
    response = operator.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    assert "json" in response["Content-Type"]
    return json.loads(response.content)


def queue_api_paths() -> set[str]:
    """Every route of queues/, fleet/ and accounts/ api/urls.py but the daemon
    protocol's (fleet/api/protocol_views.py, tested with the jobs API), spelt as OpenAPI
    spells it."""
    paths = set()
    for pattern in [*queue_urls.urlpatterns, *fleet_urls.urlpatterns, *account_urls.urlpatterns]:
        assert isinstance(pattern, URLPattern)
        if pattern.callback.view_class.__module__ == "fleet.api.protocol_views":
            continue
        route = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern))
        paths.add(f"/api/v1/{route}")
    return paths


def operations(schema: dict, path: str) -> dict:
    return {m: op for m, op in schema["paths"][path].items() if m in METHODS[path]}


def assert_documents_error(operation: dict, status: int) -> None:
    response = operation["responses"].get(str(status))
    assert response, (operation["operationId"], status, sorted(operation["responses"]))
    assert response["content"]["application/json"]["schema"] == {"$ref": ERROR_REF}
    assert response["description"]


def test_it_is_a_valid_openapi_document(schema):
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"]
    validate_schema(schema)


def test_it_lists_every_route_of_the_queue_api(schema):
    assert queue_api_paths() == set(METHODS)  # the table below keeps up with urls.py
    for path, methods in METHODS.items():
        assert path in schema["paths"], path
        assert methods <= set(schema["paths"][path]), (path, sorted(schema["paths"][path]))


def test_the_error_schema_is_the_error_body(schema):
    components = schema["components"]["schemas"]
    error = components["Error"]
    assert error["required"] == ["error"]
    detail = error["properties"]["error"]
    if "$ref" in detail:
        detail = components[detail["$ref"].rsplit("/", 1)[1]]
    assert {"code", "message", "fields"} <= set(detail["properties"])


def test_queue_add_documents_its_errors(schema):
    add = schema["paths"]["/api/v1/queues/"]["post"]

    assert "201" in add["responses"]
    for status in (400, 401, 403, 409):
        assert_documents_error(add, status)


def test_queue_rm_documents_its_errors_and_force(schema):
    rm = schema["paths"]["/api/v1/queues/{name}/"]["delete"]

    for status in (401, 403, 404, 409):
        assert_documents_error(rm, status)
    assert "force" in {p["name"] for p in rm.get("parameters", [])}


def test_every_operation_documents_401_and_403(schema):
    for path in METHODS:
        for operation in operations(schema, path).values():
            assert_documents_error(operation, 401)
            assert_documents_error(operation, 403)


def test_every_operation_on_one_object_documents_404(schema):
    for path in METHODS:
        if "{" not in path:
            continue
        for operation in operations(schema, path).values():
            assert_documents_error(operation, 404)


def test_every_operation_with_a_body_documents_400(schema):
    for path in METHODS:
        for method, operation in operations(schema, path).items():
            if method in ("post", "patch") and "requestBody" in operation:
                assert_documents_error(operation, 400)


def test_state_conflicts_are_documented_on_the_queue_actions(schema):
    for action in ("drain", "pause", "resume", "archive", "unarchive"):
        operation = schema["paths"][f"/api/v1/queues/{{name}}/{action}/"]["post"]
        assert_documents_error(operation, 409)
        assert operation.get("summary")


def test_it_documents_the_bearer_token(schema):
    schemes = schema["components"]["securitySchemes"]
    assert any(s.get("scheme") == "bearer" for s in schemes.values())


def test_the_docs_page_is_html(operator):
    response = operator.get("/api/docs/")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert b"swagger" in response.content.lower()
    script = operator.get("/api/docs/", {"script": ""})  # Swagger UI's start script
    assert b"/api/schema/" in script.content
